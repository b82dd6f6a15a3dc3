"""Which queued requests leave their pools now: Deficit Round Robin and FIFO over a fabric group.

Pure decision logic in the style of httpcore's pool: no I/O, no clock, no asyncio. The dispatcher
peeks the heads of the pools' queues, counts what is running, and calls :func:`decide`; the returned
:class:`Decision` names the heads to claim, in order. A request that cannot launch is never named, so
it stays in its queue (peek before pop).

Calling convention (for the dispatcher):

* Keep one :class:`SchedulerState` per dispatcher and group (``SchedulerState()``) and pass it to every
  call. ``decide`` **updates it in place** (copying it would cost O(pools) per call) and returns it as
  ``Decision.state``, so ``state = decision.state`` is valid but not required.
* Pass the same :class:`GroupPolicy` object while the configuration is unchanged: derived data (the
  pools with protected slots) is cached on the state by identity. A new object is simply re-indexed.
* ``observations`` maps pool id to :class:`PoolObservation`; a pool missing from it counts as idle.
  ``heads`` should hold at least ``max_burst_per_visit`` items where possible; a visit ends when the
  peeked heads run out.
* ``Launch.index`` is the position in that pool's ``heads``; per pool the indices are 0, 1, 2 ... in
  launch order. If the dispatcher cannot claim a named launch (another dispatcher took it, or it was
  dropped as expired), it may give the credit back with :func:`refund`.

DRR in brief: the ring is ``GroupPolicy.pools`` in tuple order. A round gives every backlogged pool
that can launch its ``quantum`` once; a pool then launches heads while their cost fits its deficit, up
to ``max_burst_per_visit`` per visit. A pool that stopped only because of the burst limit keeps its
credit and the round makes another pass (without new quanta) before the next round begins, so the
burst limit interleaves pools without distorting the weights. A call walks the ring from ``cursor``
pass after pass while passes launch and capacity is left. It stops:

* when the group total or the local slots are used up -- the cursor then names the pool cut off,
  which resumes its visit (without a second quantum) on the next call;
* when a pool runs out of peeked heads while it still has credit -- likewise, the visit resumes on
  the next call with fresh heads; if it ran out with no credit left, the call ends after the pass;
* when a pass launches nothing. If capacity is left and pools were refused only for credit, the
  no-spin jump first fast-forwards the empty rounds a DRR would run until one of them can pay its
  head: each such pool receives the quanta of exactly those virtual visits (so fairness is intact)
  and the first pool able to pay launches in this call. A huge-cost head is served in one call.

With unlimited burst and caps that do not bind, the launch sequence is exactly textbook DRR's,
whatever the local capacity and peek depth (a test checks this).

Credit bound: a pool's deficit never exceeds ``quantum + largest head cost seen while it was
backlogged`` (the top-up is clamped to that; a pool refused by its cap would otherwise hoard quanta),
plus the credit :func:`refund` gave back that the pool has not spent yet. Refunded credit is never
clamped away: a fleet of dispatchers loses claims to each other all the time, and clamping refunds
shorted the busiest pool a little on every lost claim, a bias that grew with the fleet. Launches
spend refunded credit first. Idle pools hold no credit: a pool that is drained by a
launch, or seen with backlog 0, drops its credit at once; at each wrap of the ring, credit of pools that
are no longer backlogged (e.g. drained by another dispatcher) is dropped too.

Protected slots: ``reserved_for_others(p)`` is the sum, over the other backlogged, unpaused, unblocked
pools ``q``, of ``max(0, min(q.min_concurrent, q.max_concurrent) - q.in_flight)``, updated as this call
launches. ``p`` may launch while ``group_in_flight < total - reserved_for_others(p)``, or -- inside its
own protected slots -- while the group total holds. Idle pools' slots are therefore lent out.

FIFO: heads of all pools are merged by ``enqueued_at`` (ties: ring order); paused, blocked and
pool-capped pools are passed over, the call stops when the group total or the local slots are used up,
or when a pool's peeked heads run out while it has more backlog (its unseen next item may be older than
the other pools' heads). FIFO keeps no credit and does not apply protected slots.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "POLICIES",
    "POLICY_DRR",
    "POLICY_FIFO",
    "SKIP_BREAKER_OPEN",
    "SKIP_GROUP_CAP",
    "SKIP_LOCAL_CAPACITY",
    "SKIP_NO_CREDIT",
    "SKIP_PAUSED",
    "SKIP_POOL_CAP",
    "SKIP_REASONS",
    "SKIP_RESERVED",
    "Decision",
    "GroupPolicy",
    "HeadItem",
    "Launch",
    "PoolObservation",
    "PoolPolicy",
    "SchedulerState",
    "decide",
    "fleet_share",
    "refund",
    "validate_policy",
]

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

_GLOBAL_REASONS = frozenset((SKIP_GROUP_CAP, SKIP_LOCAL_CAPACITY))
_BURST = "burst"  # internal stop reasons of a visit
_CREDIT = "credit"
_EMPTY = "empty"
_EXHAUSTED = "exhausted"  # peeked heads used up, no credit left: the visit is over anyway
_SUSPENDED = "suspended"  # peeked heads used up with credit left: resume this visit next call
_CUT = _GLOBAL_REASONS | {_SUSPENDED}  # stop the walk here; the cursor stays on this pool


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    """Scheduling settings of one pool (lane)."""

    pool_id: str
    quantum: int  # "Weight": credit added per round, >= 1
    max_concurrent: int  # hard in-flight cap across all dispatchers, >= 1
    min_concurrent: int = 0  # protected running slots while this pool has backlog
    max_burst_per_visit: int = 1  # >= 1
    paused: bool = False


@dataclass(frozen=True, slots=True)
class GroupPolicy:
    """Scheduling settings of a fabric group; ``pools`` order is the DRR ring order."""

    policy: str  # "drr" | "fifo"
    total_concurrency: int  # group-wide in-flight cap
    pools: tuple[PoolPolicy, ...]


@dataclass(frozen=True, slots=True)
class HeadItem:
    """One peeked request at the head of a pool's queue."""

    cost: int
    enqueued_at: float


@dataclass(frozen=True, slots=True)
class PoolObservation:
    """What the dispatcher sees of one pool right now."""

    pool_id: str
    backlog: int  # queue length (LLEN)
    heads: tuple[HeadItem, ...]  # the first few queued items, in queue order (may be fewer than backlog)
    in_flight: int  # running now, counted across ALL dispatchers of the group
    blocked: str | None = None  # external refusal reason, e.g. "breaker_open"; the pool can't launch


@dataclass(frozen=True, slots=True)
class _Index:
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
    index: _Index | None = field(default=None, repr=False, compare=False)

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


@dataclass(frozen=True, slots=True)
class Launch:
    """Claim the item at ``index`` of ``pool_id``'s peeked heads."""

    pool_id: str
    index: int
    cost: int


@dataclass(frozen=True, slots=True)
class Decision:
    """The result of one :func:`decide` call."""

    launches: tuple[Launch, ...]  # in the order the dispatcher must claim them
    state: SchedulerState
    skips: dict[tuple[str, str], int]  # (pool_id, reason) -> count for this call


class _Call:
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
        owed_before = _owed(pool, obs, done)
        self.launched[pid] = done + 1
        self.reserved += _owed(pool, obs, done + 1) - owed_before
        self.group_used += 1
        self.local_free -= 1
        self.launches.append(Launch(pid, index, cost))


def _owed(pool: PoolPolicy, obs: PoolObservation, launched: int) -> int:
    """Protected slots ``pool`` still claims after ``launched`` launches in this call."""
    if pool.min_concurrent <= 0 or pool.paused or obs.blocked or obs.backlog - launched <= 0:
        return 0
    return max(0, min(pool.min_concurrent, pool.max_concurrent) - obs.in_flight - launched)


def _index(policy: GroupPolicy, state: SchedulerState) -> _Index:
    index = state.index
    if index is None or index.policy is not policy:
        index = _Index(policy, tuple(p for p in policy.pools if p.min_concurrent > 0))
        state.index = index
    return index


def _backlogged(obs: PoolObservation | None) -> bool:
    return obs is not None and obs.backlog > 0


def decide(
    policy: GroupPolicy,
    state: SchedulerState,
    observations: Mapping[str, PoolObservation],
    *,
    group_in_flight: int,
    local_free_slots: int,
) -> Decision:
    """Decide which peeked heads to launch now. Updates ``state`` in place; see the module docstring."""
    if policy.policy == POLICY_FIFO:
        return _decide_fifo(policy, state, observations, group_in_flight, local_free_slots)
    if policy.policy != POLICY_DRR:
        raise ValueError(f"unknown scheduling policy {policy.policy!r}; expected one of {POLICIES}")
    reserved = 0
    for pool in _index(policy, state).protected:
        obs = observations.get(pool.pool_id)
        if obs is not None:
            reserved += _owed(pool, obs, 0)
    call = _Call(policy.total_concurrency, group_in_flight, local_free_slots, reserved)
    if policy.pools:
        _walk(policy.pools, state, observations, call)
    return Decision(tuple(call.launches), state, call.skips)


def _walk(
    pools: tuple[PoolPolicy, ...],
    state: SchedulerState,
    observations: Mapping[str, PoolObservation],
    call: _Call,
) -> None:
    """Walk the ring from the cursor, pass after pass, while passes launch and capacity is left.

    Stops when capacity runs out (the cursor then names the pool cut off), when a pass launches
    nothing and the no-spin jump does not apply, or when a pool ran out of peeked heads: further
    rounds would then be unfair to it.
    """
    n = len(pools)
    start = state.cursor % n
    while True:
        before = len(call.launches)
        starved: _Starved = []
        cut = _pass(pools, start, state, observations, call, starved)
        if cut is None and len(call.launches) == before:
            if not starved or not call.has_capacity():
                _record_starved(call, starved)
                state.cursor = start
                return
            pos, stopped = _jump(state, call, starved)
            if stopped:
                cut = pos
            else:
                if pos == n - 1:
                    _end_pass(state, observations)
                start = pos + 1 if pos + 1 < n else 0  # the round goes on after the pool served
        else:
            _record_starved(call, starved)
        if cut is not None:
            state.cursor = cut
            return
        state.cursor = start
        if call.exhausted or not call.has_capacity():
            return


def _pass(
    pools: tuple[PoolPolicy, ...],
    start: int,
    state: SchedulerState,
    observations: Mapping[str, PoolObservation],
    call: _Call,
    starved: _Starved,
) -> int | None:
    """Visit every ring position once from ``start``; return the position cut off by capacity, if any."""
    n = len(pools)
    for step in range(n):
        pos = start + step
        if pos >= n:
            pos -= n
        pool = pools[pos]
        obs = observations.get(pool.pool_id)
        if obs is None or obs.backlog <= 0:
            state.forget(pool.pool_id)  # idle: leaves the rotation with no credit
        elif obs.heads and _visit(pos, pool, obs, state, call, starved) in _CUT:
            return pos
        if pos == n - 1:
            _end_pass(state, observations)
    return None


def _visit(
    pos: int,
    pool: PoolPolicy,
    obs: PoolObservation,
    state: SchedulerState,
    call: _Call,
    starved: _Starved,
) -> str | None:
    """Visit one backlogged pool: refuse it, or top up its credit and serve it. Returns the stop reason."""
    pid = pool.pool_id
    reason = call.refusal(pool, obs)
    if reason is not None:
        call.skip(pid, reason)
        return reason
    index = call.launched.get(pid, 0)
    if index >= len(obs.heads):
        return None  # duplicated pool id: nothing more peeked for it in this call
    seen = max(state.max_cost.get(pid, 0), obs.heads[index].cost)
    state.max_cost[pid] = seen
    deficit = state.deficits.get(pid, 0)
    if state.credited.get(pid) != state.round:
        state.credited[pid] = state.round
        deficit = _top_up(state, pid, deficit, pool.quantum, pool.quantum + seen)
    state.deficits[pid] = deficit
    stop = _serve(pool, obs, state, call)
    if stop == _CREDIT and call.launched.get(pid, 0) == index:
        starved.append((pos, pool, obs))
    return stop


def _serve(pool: PoolPolicy, obs: PoolObservation, state: SchedulerState, call: _Call) -> str:
    """Launch heads of ``pool`` while credit, burst, heads and capacity allow; return why it stopped."""
    pid = pool.pool_id
    deficit = state.deficits[pid]
    index = call.launched.get(pid, 0)
    heads = obs.heads
    burst = 0
    max_cost = state.max_cost
    while True:
        if index >= obs.backlog:
            state.forget(pid)  # drained: leaves the rotation with no credit
            return _EMPTY
        if index >= len(heads):
            # More backlog than peeked: the dispatcher must peek again before another round.
            call.exhausted = True
            stop = _BURST if burst >= pool.max_burst_per_visit else _SUSPENDED if deficit > 0 else _EXHAUSTED
            break
        cost = heads[index].cost
        if cost > max_cost[pid]:
            max_cost[pid] = cost
        if cost > deficit:
            stop = _CREDIT
            break
        if burst >= pool.max_burst_per_visit:
            stop = _BURST
            break
        reason = call.refusal(pool, obs)
        if reason is not None:
            call.skip(pid, reason)
            stop = reason
            break
        call.launch(pool, obs, index, cost)
        deficit -= cost
        index += 1
        burst += 1
    spent = state.deficits[pid] - deficit
    if spent and pid in state.refunded:
        _spend_refund(state, pid, spent)
    state.deficits[pid] = deficit
    if stop == _BURST and deficit > 0:
        state.carry = True  # credit left over: another pass of this round before the next quantum
    return stop


def _top_up(state: SchedulerState, pool_id: str, deficit: int, credit: int, bound: int) -> int:
    """``deficit + credit`` clamped to ``bound``; refunded credit not spent yet is kept above the bound."""
    refunded = state.refunded.get(pool_id, 0)
    return min(deficit + credit, bound + refunded)


def _spend_refund(state: SchedulerState, pool_id: str, spent: int) -> None:
    left = state.refunded[pool_id] - spent
    if left > 0:
        state.refunded[pool_id] = left
    else:
        del state.refunded[pool_id]


def _end_pass(state: SchedulerState, observations: Mapping[str, PoolObservation]) -> None:
    """The walk wrapped the ring: drop stale credit and start a new round unless credit is carried."""
    stale = [pid for pid in state.deficits if not _backlogged(observations.get(pid))]
    for pid in stale:
        state.forget(pid)
    if not state.carry:
        state.round += 1
    state.carry = False


_Starved = list[tuple[int, PoolPolicy, PoolObservation]]  # (ring position, pool, observation)


def _record_starved(call: _Call, starved: _Starved) -> None:
    for _, pool, _obs in starved:
        call.skip(pool.pool_id, SKIP_NO_CREDIT)


def _jump(state: SchedulerState, call: _Call, starved: _Starved) -> tuple[int, bool]:
    """No-spin: skip the empty rounds a DRR would run before some starved pool can pay its head.

    Virtual visits continue in ring order from where each pool stands (its ``credited`` round and its
    ring position); the first visit after which a pool can pay wins. Every starved pool receives the
    quanta of the virtual visits up to that point -- exactly what the empty rounds would have given
    -- and the winner is served. Returns the winner's position and whether capacity cut it off.
    """
    deficits, credited = state.deficits, state.credited
    best: tuple[tuple[int, int], PoolPolicy, PoolObservation] | None = None
    for pos, pool, obs in starved:
        pid = pool.pool_id
        need = obs.heads[call.launched.get(pid, 0)].cost - deficits[pid]
        when = (credited[pid] + -(-need // pool.quantum), pos)
        if best is None or when < best[0]:
            best = (when, pool, obs)
    assert best is not None
    (target_round, target_pos), winner, winner_obs = best
    for pos, pool, _obs in starved:
        pid = pool.pool_id
        visits = target_round - credited[pid] - (1 if pos > target_pos else 0)
        if visits > 0:
            deficits[pid] = _top_up(
                state, pid, deficits[pid], visits * pool.quantum, pool.quantum + state.max_cost[pid]
            )
            credited[pid] += visits
        if pool is not winner:
            call.skip(pid, SKIP_NO_CREDIT)
    state.round = target_round
    state.carry = False
    stop = _serve(winner, winner_obs, state, call)
    return target_pos, stop in _CUT


def refund(state: SchedulerState, launch: Launch) -> None:
    """Give back the credit of a launch the dispatcher could not claim.

    The credit survives the next round: while it pays the pool's head, the pool resumes its visit
    instead of receiving (and clamping) a new quantum, so a fleet's lost claims cost no fairness.
    A pool that the launch drained has left the rotation and gets nothing back.
    """
    pid = launch.pool_id
    if pid in state.deficits or pid in state.credited:
        state.deficits[pid] = state.deficits.get(pid, 0) + launch.cost
        state.refunded[pid] = state.refunded.get(pid, 0) + launch.cost


def _decide_fifo(
    policy: GroupPolicy,
    state: SchedulerState,
    observations: Mapping[str, PoolObservation],
    group_in_flight: int,
    local_free_slots: int,
) -> Decision:
    """Launch in global arrival order across the pools' peeked heads."""
    if state.deficits:
        state.deficits.clear()
        state.credited.clear()
        state.max_cost.clear()
        state.refunded.clear()
    call = _Call(policy.total_concurrency, group_in_flight, local_free_slots, 0)
    heap: list[tuple[float, int, int]] = []
    pools = policy.pools
    for pos, pool in enumerate(pools):
        obs = observations.get(pool.pool_id)
        if obs is not None and obs.backlog > 0 and obs.heads:
            heap.append((obs.heads[0].enqueued_at, pos, 0))
    heapq.heapify(heap)
    while heap:
        _, pos, index = heapq.heappop(heap)
        pool = pools[pos]
        obs = observations[pool.pool_id]
        reason = call.refusal(pool, obs)
        if reason is not None:
            call.skip(pool.pool_id, reason)
            if reason in _GLOBAL_REASONS:
                break
            continue
        if index >= len(obs.heads):
            break  # barrier: this pool's unseen next item may be older than every other head
        call.launch(pool, obs, index, obs.heads[index].cost)
        index += 1
        if index < obs.backlog:
            at = obs.heads[index].enqueued_at if index < len(obs.heads) else obs.heads[-1].enqueued_at
            heapq.heappush(heap, (at, pos, index))
    return Decision(tuple(call.launches), state, call.skips)


def fleet_share(total_concurrency: int, own_slots: int, fleet_slots: Sequence[int]) -> int:
    """Slots of the group a dispatcher with ``own_slots`` local slots may hold, in a fleet whose
    members (this one included) have ``fleet_slots``: the group total split in proportion to local
    slots (evenly for equal dispatchers), rounded up, never more than ``own_slots``.

    Rounded up and proportional, the shares add up to at least the total (or to every local slot when
    the fleet has fewer than the total), so the group's slots can all be used: work-conserving.
    """
    capacity = sum(fleet_slots)
    if capacity <= total_concurrency or own_slots <= 0:
        return max(0, own_slots)
    return min(own_slots, -(-total_concurrency * own_slots // capacity))


def validate_policy(policy: GroupPolicy) -> list[str]:
    """Human-readable problems of a group policy; an empty list means it is valid."""
    problems: list[str] = []
    if policy.policy not in POLICIES:
        problems.append(f"unknown scheduling policy {policy.policy!r}; expected one of {', '.join(POLICIES)}")
    if policy.total_concurrency < 1:
        problems.append(f"total concurrency must be at least 1, got {policy.total_concurrency}")
    seen: set[str] = set()
    for pool in policy.pools:
        if pool.pool_id in seen:
            problems.append(f"pool {pool.pool_id!r} appears more than once")
        seen.add(pool.pool_id)
        problems.extend(_pool_problems(pool))
    protected = sum(max(0, p.min_concurrent) for p in policy.pools if not p.paused)
    if protected > policy.total_concurrency:
        problems.append(
            f"protected slots of enabled pools (sum of min concurrent = {protected}) exceed the group's "
            f"total concurrency ({policy.total_concurrency})"
        )
    return problems


def _pool_problems(pool: PoolPolicy) -> list[str]:
    name = f"pool {pool.pool_id!r}"
    problems: list[str] = []
    if pool.quantum < 1:
        problems.append(f"{name}: weight (quantum) must be at least 1, got {pool.quantum}")
    if pool.max_concurrent < 1:
        problems.append(f"{name}: max concurrent must be at least 1, got {pool.max_concurrent}")
    if pool.min_concurrent < 0:
        problems.append(f"{name}: min concurrent must not be negative, got {pool.min_concurrent}")
    if pool.min_concurrent > pool.max_concurrent:
        problems.append(
            f"{name}: min concurrent ({pool.min_concurrent}) exceeds max concurrent ({pool.max_concurrent})"
        )
    if pool.max_burst_per_visit < 1:
        problems.append(f"{name}: max burst per visit must be at least 1, got {pool.max_burst_per_visit}")
    return problems
