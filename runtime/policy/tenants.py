"""Fairness between the tenants of one pool: virtual token counters (VTC, Sheng et al., OSDI 2024).

Pure state, no I/O, no clock. Inside the share DRR gives a pool, the pool's next request comes from
the backlogged tenant with the smallest virtual counter. A tenant's counter grows by the cost of
what it launched divided by its weight: charged at launch by an estimate, then corrected on
completion by the difference between the actual usage and the estimate (no usage reported: the
estimate stands). A tenant that becomes backlogged again re-enters at the smallest counter of the
backlogged tenants (or, when none is, at the counter of the last tenant that left), so time away
banks no credit, and one that stayed busy keeps its own, higher counter.

The state is plain numbers, as Valkey will hold it: a hash ``tenant -> counter`` for every tenant
with a counter, a sorted set ``tenant -> counter`` of the backlogged ones (ties broken by tenant id,
which is how a sorted set orders equal scores), and one number, the counter of the last tenant
that left the backlog. :class:`TenantLedger` keeps the sorted set as a heap with lazy deletion, so
picking, charging, entering and leaving cost O(log n) in the number of backlogged tenants.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Mapping, Sequence

from runtime.immutable import immutable

__all__ = [
    "MODES",
    "OFF",
    "REQUESTS",
    "TOKENS",
    "TenantCost",
    "TenantLedger",
    "plan_picks",
    "validate_tenant_weight",
]

OFF = "off"  # first come, first served inside the pool (the seed's behaviour)
REQUESTS = "requests"  # every request costs 1
TOKENS = "tokens"  # input_weight * prompt tokens + output_weight * output tokens
MODES = (OFF, REQUESTS, TOKENS)


def validate_tenant_weight(weight: float) -> float:
    """A tenant's weight must be a finite number above 0 (share is relative to it)."""
    if not weight > 0 or weight == float("inf"):  # also refuses NaN
        raise ValueError(f"a tenant weight must be a finite number above 0, got {weight!r}")
    return float(weight)


@immutable
class TenantCost:
    """What one request costs a tenant in a pool's ``tenant_fairness`` mode."""

    mode: str = TOKENS
    input_weight: float = 1.0
    output_weight: float = 4.0

    def __post_init__(self) -> None:
        if self.mode not in (REQUESTS, TOKENS):
            raise ValueError(f"tenant cost mode must be {REQUESTS!r} or {TOKENS!r}, got {self.mode!r}")
        for name in ("input_weight", "output_weight"):
            value = getattr(self, name)
            if not 0 <= value < float("inf"):
                raise ValueError(f"TenantCost.{name} must be a finite number >= 0, got {value!r}")

    def of(self, prompt_tokens: int, output_tokens: int) -> float:
        """The cost of a request with these token counts (negative counts count as 0)."""
        if self.mode == REQUESTS:
            return 1.0
        return self.input_weight * max(0, prompt_tokens) + self.output_weight * max(0, output_tokens)

    def correction(self, estimate: tuple[int, int], actual: tuple[int, int] | None) -> float:
        """What to add to the tenant's (unweighted) charge on completion: actual minus estimate.

        ``actual`` None (the backend reported no usage) keeps the estimate: the difference is 0.
        In ``requests`` mode a request costs 1 whatever it used, so there is never a difference.
        """
        if actual is None or self.mode == REQUESTS:
            return 0.0
        return self.of(*actual) - self.of(*estimate)


class TenantLedger:
    """The virtual counters of one pool's tenants and which of them are backlogged.

    The dispatcher calls :meth:`enter` when a tenant's sub-queue goes from empty to non-empty,
    :meth:`pick` for the tenant to launch from, :meth:`charge` with the launch's estimate,
    :meth:`leave` when the tenant's sub-queue is empty again, and :meth:`correct` on completion.
    """

    __slots__ = ("_heap", "_weights", "backlogged", "counters", "last_left")

    def __init__(
        self,
        counters: Mapping[str, float] | None = None,
        backlogged: Iterable[str] = (),
        *,
        last_left: float = 0.0,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        self.counters: dict[str, float] = dict(counters or {})
        self.last_left = float(last_left)
        self._weights: dict[str, float] = {t: validate_tenant_weight(w) for t, w in (weights or {}).items()}
        self.backlogged: set[str] = set()
        self._heap: list[tuple[float, str]] = []
        for tenant in backlogged:
            self.counters.setdefault(tenant, self.last_left)
            self.backlogged.add(tenant)
            self._heap.append((self.counters[tenant], tenant))
        heapq.heapify(self._heap)

    def __repr__(self) -> str:
        floor = self.floor()
        return (
            f"<TenantLedger backlogged={len(self.backlogged)} counters={len(self.counters)} floor={floor:g}>"
        )

    def weight(self, tenant: str) -> float:
        return self._weights.get(tenant, 1.0)

    def set_weight(self, tenant: str, weight: float) -> None:
        self._weights[tenant] = validate_tenant_weight(weight)

    def floor(self) -> float:
        """Where a tenant re-enters: the smallest backlogged counter, else the last leaver's."""
        head = self._head()
        return head[0] if head is not None else self.last_left

    def enter(self, tenant: str) -> float:
        """``tenant`` has queued work again; returns its counter, lifted to :meth:`floor` if below it.

        Entering while already backlogged changes nothing (a second submit to a busy sub-queue).
        """
        if tenant in self.backlogged:
            return self.counters[tenant]
        floor = self.floor()
        # A tenant without a counter starts at the floor: the last leaver's counter is only the floor
        # when nobody is backlogged, and a newcomer must not start behind the tenants that wait.
        counter = max(self.counters.get(tenant, floor), floor)
        self.counters[tenant] = counter
        self.backlogged.add(tenant)
        heapq.heappush(self._heap, (counter, tenant))
        return counter

    def pick(self) -> str | None:
        """The backlogged tenant with the smallest counter (ties: the smallest id); None when none is."""
        head = self._head()
        return head[1] if head is not None else None

    def charge(self, tenant: str, cost: float) -> float:
        """Adds ``cost / weight`` to the tenant's counter (a launch's estimate); returns the counter."""
        return self._add(tenant, cost)

    def correct(self, tenant: str, difference: float) -> float:
        """Adds ``difference / weight`` on completion (see :meth:`TenantCost.correction`).

        A tenant no longer backlogged is corrected too: the counter it re-enters with stays honest.
        """
        return self._add(tenant, difference)

    def leave(self, tenant: str) -> None:
        """``tenant``'s sub-queue is empty: it stops competing, and its counter is remembered."""
        if tenant not in self.backlogged:
            return
        self.backlogged.discard(tenant)
        self.last_left = self.counters[tenant]

    def forget_idle(self, in_flight: Collection[str] = ()) -> int:
        """Drops the counters of idle tenants at or below :meth:`floor`, except those in ``in_flight``
        (their completions still correct their counters). Returns how many were dropped.

        A dropped tenant would re-enter at the floor anyway, and the floor only rises while every
        correction is upward, so then forgetting changes no decision. A downward correction can
        lower the floor; a tenant forgotten before it re-enters at most that much lower than it
        would have, which bounds what the memory saved costs in fairness.
        """
        floor = self.floor()
        keep = set(in_flight)
        idle = [
            t for t, c in self.counters.items() if c <= floor and t not in self.backlogged and t not in keep
        ]
        for tenant in idle:
            del self.counters[tenant]
        return len(idle)

    def _add(self, tenant: str, cost: float) -> float:
        before = self.counters.get(tenant, self.floor())
        counter = before + cost / self.weight(tenant)
        self.counters[tenant] = counter
        if tenant not in self.backlogged:
            return counter
        heap = self._heap
        if heap and heap[0] == (before, tenant):
            heapq.heapreplace(heap, (counter, tenant))  # the usual launch: the picked head moves down
        else:
            heapq.heappush(heap, (counter, tenant))
            if len(heap) > 4 * len(self.backlogged) + 64:
                self._rebuild()  # stale entries of tenants corrected off the head would pile up otherwise
        return counter

    def _rebuild(self) -> None:
        self._heap = [(self.counters[t], t) for t in self.backlogged]
        heapq.heapify(self._heap)

    def _head(self) -> tuple[float, str] | None:
        """The heap's smallest live entry, dropping stale ones (a tenant gone, or charged since)."""
        heap = self._heap
        while heap:
            counter, tenant = heap[0]
            if tenant in self.backlogged and self.counters.get(tenant) == counter:
                return heap[0]
            heapq.heappop(heap)
        return None


def plan_picks(
    ledger: TenantLedger,
    heads: Mapping[str, Sequence[float]],
    queued: Mapping[str, int],
    launches: int,
    *,
    horizon: tuple[float, str] | None = None,
) -> list[tuple[str, float]]:
    """The next ``launches`` picks of a pool, in order, as (tenant, cost) with the cost charged.

    ``ledger`` is a view of the pool's lowest backlogged counters, as one read returns them (it is
    charged as the plan goes, so pass a copy); ``heads`` holds the costs of each viewed tenant's
    first queued requests, and ``queued`` how many each has queued in all. ``horizon`` is (counter,
    tenant) of the first backlogged tenant the view left out (None: it left out none). The plan
    stops early rather than guess: once the next pick would come after the horizon (the unseen
    tenant may be next), or when the next tenant's next request was not read. A tenant whose queue
    the plan empties leaves the backlog.
    """
    picks: list[tuple[str, float]] = []
    taken: dict[str, int] = {}
    while len(picks) < launches:
        tenant = ledger.pick()
        if tenant is None or (horizon is not None and (ledger.counters[tenant], tenant) > horizon):
            break
        index = taken.get(tenant, 0)
        costs = heads.get(tenant, ())
        if index >= len(costs):
            break
        ledger.charge(tenant, costs[index])
        picks.append((tenant, costs[index]))
        taken[tenant] = index + 1
        if queued.get(tenant, 0) <= index + 1:
            ledger.leave(tenant)
    return picks
