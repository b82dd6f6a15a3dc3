"""The scheduler's vocabulary: group and pool policies, what the dispatcher observes of each pool, the
state carried between calls, the decision returned, and the budget of one call.

See :mod:`runtime.policy.scheduler` for the calling convention and the rules; :mod:`runtime.policy.drr`
and :mod:`runtime.policy.fifo` decide with these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.immutable import immutable

POLICY_DRR = "drr"
POLICY_FIFO = "fifo"
POLICIES = (POLICY_DRR, POLICY_FIFO)

SKIP_NO_CREDIT = "no_credit"  # the head costs more than the pool's credit
SKIP_POOL_CAP = "pool_cap"  # the pool's max_concurrent is reached
SKIP_GROUP_CAP = "group_cap"  # the group's total_concurrency is reached
SKIP_RESERVED = "reserved"  # the only free group slots are protected for other backlogged pools
SKIP_PAUSED = "paused"  # the pool is paused by an operator
SKIP_LOCAL_CAPACITY = "local_capacity"  # this dispatcher has no free slot
SKIP_BREAKER_OPEN = "breaker_open"  # the usual PoolObservation.blocked value; any blocked string is a reason
SKIP_REASONS = (
    SKIP_NO_CREDIT,
    SKIP_POOL_CAP,
    SKIP_GROUP_CAP,
    SKIP_RESERVED,
    SKIP_PAUSED,
    SKIP_LOCAL_CAPACITY,
    SKIP_BREAKER_OPEN,
)

GLOBAL_REASONS = frozenset((SKIP_GROUP_CAP, SKIP_LOCAL_CAPACITY))


@immutable
class PoolPolicy:
    """Scheduling settings of one pool (lane)."""

    pool_id: str
    quantum: int  # "Weight": credit added per round, >= 1
    max_concurrent: int  # hard in-flight cap across all dispatchers, >= 1
    min_concurrent: int = 0  # protected running slots while this pool has backlog
    max_burst_per_visit: int = 1  # >= 1
    paused: bool = False


@immutable
class GroupPolicy:
    """Scheduling settings of a fabric group; ``pools`` order is the DRR ring order."""

    policy: str  # "drr" | "fifo"
    total_concurrency: int  # group-wide in-flight cap
    pools: tuple[PoolPolicy, ...]


@immutable
class HeadItem:
    """One peeked request at the head of a pool's queue."""

    cost: int
    enqueued_at: float


@immutable
class PoolObservation:
    """What the dispatcher sees of one pool right now."""

    pool_id: str
    backlog: int  # queue length (LLEN)
    heads: tuple[HeadItem, ...]  # the first few queued items, in queue order (may be fewer than backlog)
    in_flight: int  # running now, counted across ALL dispatchers of the group
    blocked: str | None = None  # external refusal reason, e.g. "breaker_open"; the pool can't launch


@immutable
class PolicyIndex:
    """Data derived from a GroupPolicy, cached on the state by identity."""

    policy: GroupPolicy
    protected: tuple[PoolPolicy, ...]


@dataclass(slots=True)
class SchedulerState:
    """Scheduler memory carried between calls by one dispatcher; :func:`decide` updates it in place."""

    deficits: dict[str, int] = field(default_factory=dict)  # credit of backlogged pools (absent = 0)
    cursor: int = 0  # ring position where the next walk starts
    round: int = 0  # current DRR round (a label; only equality matters)
    credited: dict[str, int] = field(default_factory=dict)  # round in which a pool last got its quantum
    max_cost: dict[str, int] = field(default_factory=dict)  # largest head cost seen while backlogged
    refunded: dict[str, int] = field(default_factory=dict)  # refunded credit not spent yet (never clamped)
    carry: bool = False  # a pool stopped by its burst limit still holds credit: another pass this round
    index: PolicyIndex | None = field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        credit = sum(self.deficits.values())
        return (
            f"<SchedulerState cursor={self.cursor} round={self.round} carry={self.carry} "
            f"credited_pools={len(self.deficits)} total_credit={credit}>"
        )

    def deficit(self, pool_id: str) -> int:
        """Credit the pool holds now (0 when it has none)."""
        return self.deficits.get(pool_id, 0)

    def forget(self, pool_id: str) -> None:
        """Drop everything known about a pool: it left the rotation (idle) and keeps no credit."""
        self.deficits.pop(pool_id, None)
        self.credited.pop(pool_id, None)
        self.max_cost.pop(pool_id, None)
        self.refunded.pop(pool_id, None)


@immutable
class Launch:
    """Claim the item at ``index`` of ``pool_id``'s peeked heads."""

    pool_id: str
    index: int
    cost: int


@immutable
class Decision:
    """The result of one :func:`decide` call."""

    launches: tuple[Launch, ...]  # in the order the dispatcher must claim them
    state: SchedulerState
    skips: dict[tuple[str, str], int]  # (pool_id, reason) -> count for this call


class Budget:
    """Bookkeeping of one decide call: capacity used so far, launches, skips."""

    __slots__ = (
        "exhausted",
        "group_used",
        "launched",
        "launches",
        "local_free",
        "reserved",
        "skips",
        "total",
    )

    def __init__(self, total: int, group_used: int, local_free: int, reserved: int) -> None:
        self.total = total
        self.group_used = group_used
        self.local_free = local_free
        self.reserved = reserved  # sum of protected slots still owed to backlogged pools
        self.launched: dict[str, int] = {}
        self.launches: list[Launch] = []
        self.skips: dict[tuple[str, str], int] = {}
        self.exhausted = False  # some pool ran out of peeked heads while it still had backlog

    def skip(self, pool_id: str, reason: str) -> None:
        key = (pool_id, reason)
        self.skips[key] = self.skips.get(key, 0) + 1

    def has_capacity(self) -> bool:
        return self.group_used < self.total and self.local_free > 0

    def refusal(self, pool: PoolPolicy, obs: PoolObservation) -> str | None:
        """Why ``pool`` cannot launch one more item right now (credit aside), or None."""
        if pool.paused:
            return SKIP_PAUSED
        if obs.blocked:
            return obs.blocked
        running = obs.in_flight + self.launched.get(pool.pool_id, 0)
        if running >= pool.max_concurrent:
            return SKIP_POOL_CAP
        if self.group_used >= self.total:
            return SKIP_GROUP_CAP
        if self.local_free <= 0:
            return SKIP_LOCAL_CAPACITY
        if running < pool.min_concurrent:
            return None  # inside its own protected slots
        # The pool owes itself nothing (running >= min), so every reserved slot is for others.
        if self.group_used >= self.total - self.reserved:
            return SKIP_RESERVED
        return None

    def launch(self, pool: PoolPolicy, obs: PoolObservation, index: int, cost: int) -> None:
        pid = pool.pool_id
        done = self.launched.get(pid, 0)
        self.launched[pid] = done + 1
        if pool.min_concurrent > 0:  # a pool without protected slots owes none (launches are hot)
            self.reserved += owed(pool, obs, done + 1) - owed(pool, obs, done)
        self.group_used += 1
        self.local_free -= 1
        self.launches.append(Launch(pid, index, cost))


def owed(pool: PoolPolicy, obs: PoolObservation, launched: int) -> int:
    """Protected slots ``pool`` still claims after ``launched`` launches in this call."""
    if pool.min_concurrent <= 0 or pool.paused or obs.blocked or obs.backlog - launched <= 0:
        return 0
    return max(0, min(pool.min_concurrent, pool.max_concurrent) - obs.in_flight - launched)
