"""A replayed pool's queue: first come, first served, or fair between its tenants.

Both hold request indices of the trace and answer the replay's three questions: how many are
queued, which come next (the heads the scheduler is shown) and which leaves at a launch.

:class:`FairQueue` is a pool with ``tenant_fairness`` on, scheduled as the dispatcher schedules it
(:mod:`runtime.dispatch.tenant_round`), with the same pure code: one FIFO per tenant, a
:class:`~runtime.policy.tenants.TenantLedger` of the tenants' virtual counters, heads planned by
:func:`~runtime.policy.tenants.plan_picks` over a view of the :data:`TENANT_VIEW_WIDTH` lowest
backlogged tenants with the next one as the horizon (what ``lua/tenant_observe.lua`` reads). A launch
charges its tenant the estimate (the recorded prompt tokens and the pool's default output tokens: the
replay has no messages to count), and its completion corrects the charge by the recorded usage.
Untagged requests are the tenant ``*``, as on the seed's list.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Mapping
from itertools import islice

from runtime.policy.tenants import TenantCost, TenantLedger, plan_picks
from runtime.queue.tenant_dispatch import TENANT_VIEW_WIDTH
from runtime.whatif.trace import Trace
from runtime.wire.groupconfig import PoolConfig

__all__ = ["UNTAGGED", "FairQueue", "FifoQueue"]

UNTAGGED = "*"  # the tenant of a fair pool's untagged requests (the seed's list)


class FifoQueue(deque[int]):
    """A pool's queue in arrival order (``tenant_fairness`` off)."""

    def first(self, n: int) -> list[int]:
        return list(islice(self, n))

    def refuses(self, i: int) -> bool:
        """Per-tenant admission: a first-come pool has none."""
        return False

    def finished(self, i: int) -> None:
        """A launched request completed: nothing to correct."""


class FairQueue:
    """A fair pool's queue (see the module docstring)."""

    __slots__ = ("_cost", "_ledger", "_output", "_queues", "_size", "_tenant_of", "_trace", "max_per_tenant")

    def __init__(self, trace: Trace, pool: PoolConfig, weights: Mapping[str, float]) -> None:
        self._trace = trace
        self._cost = pool.tenant_cost() or TenantCost()
        self._output = pool.tenant_default_output_tokens
        self._tenant_of = [t or UNTAGGED for t in trace.tenants]  # trace tenant index -> ledger name
        self._ledger = TenantLedger(weights=weights)
        self._queues: dict[str, deque[int]] = {}
        self._size = 0
        self.max_per_tenant = pool.max_queued_per_tenant

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"<FairQueue queued={self._size} {self._ledger!r}>"

    @property
    def ledger(self) -> TenantLedger:
        return self._ledger

    def tenant(self, i: int) -> str:
        return self._tenant_of[self._trace.tenant[i]]

    def refuses(self, i: int) -> bool:
        """The pool's ``max_queued_per_tenant`` holds request ``i``'s tenant out (QueueFull at submit)."""
        if self.max_per_tenant is None:
            return False
        queue = self._queues.get(self.tenant(i))
        return queue is not None and len(queue) >= self.max_per_tenant

    def append(self, i: int) -> None:
        tenant = self.tenant(i)
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = deque()
        if not queue:
            self._ledger.enter(tenant)
        queue.append(i)
        self._size += 1

    def first(self, n: int) -> list[int]:
        """The next ``n`` (or fewer) requests as the dispatcher plans them from one observation."""
        ledger = self._ledger
        low = heapq.nsmallest(TENANT_VIEW_WIDTH + 1, ((ledger.counters[t], t) for t in ledger.backlogged))
        viewed = low[:TENANT_VIEW_WIDTH]
        horizon = low[TENANT_VIEW_WIDTH] if len(low) > TENANT_VIEW_WIDTH else None
        # Heads read per viewed tenant, as the observe script reads them: about twice its share of n.
        per = min(n, max(2, math.ceil(2 * n / max(1, min(TENANT_VIEW_WIDTH, len(low))))))
        weights = {t: ledger.weight(t) for _, t in viewed}
        view = TenantLedger({t: c for c, t in viewed}, [t for _, t in viewed], weights=weights)
        heads = {t: [self._charge(i) for i in islice(self._queues[t], per)] for _, t in viewed}
        queued = {t: len(self._queues[t]) for _, t in viewed}
        taken: dict[str, int] = {}
        planned = []
        for tenant, _ in plan_picks(view, heads, queued, n, horizon=horizon):
            k = taken.get(tenant, 0)
            taken[tenant] = k + 1
            planned.append(self._queues[tenant][k])
        return planned

    def popleft(self) -> int:
        """The launch of the first planned head: the lowest counter's tenant, charged its estimate."""
        ledger = self._ledger
        tenant = ledger.pick()
        assert tenant is not None, "a launch from an empty fair queue"
        queue = self._queues[tenant]
        i = queue.popleft()
        self._size -= 1
        ledger.charge(tenant, self._charge(i))
        if not queue:
            ledger.leave(tenant)
        return i

    def finished(self, i: int) -> None:
        """Request ``i`` completed: its tenant's charge is corrected by the usage history recorded."""
        trace = self._trace
        used = (trace.input_tokens[i], trace.output_tokens[i])
        difference = self._cost.correction(self._estimate(i), used if any(used) else None)
        if difference:
            self._ledger.correct(self.tenant(i), difference)

    def _estimate(self, i: int) -> tuple[int, int]:
        return self._trace.input_tokens[i], self._output

    def _charge(self, i: int) -> float:
        return self._cost.of(*self._estimate(i))
