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

from collections.abc import Mapping, Sequence

from runtime.policy.decisions import (
    POLICIES,
    POLICY_DRR,
    POLICY_FIFO,
    SKIP_BREAKER_OPEN,
    SKIP_GROUP_CAP,
    SKIP_LOCAL_CAPACITY,
    SKIP_NO_CREDIT,
    SKIP_PAUSED,
    SKIP_POOL_CAP,
    SKIP_REASONS,
    SKIP_RESERVED,
    Budget,
    Decision,
    GroupPolicy,
    HeadItem,
    Launch,
    PoolObservation,
    PoolPolicy,
    SchedulerState,
    owed,
)
from runtime.policy.drr import policy_index, refund, walk
from runtime.policy.fifo import decide_fifo

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
        return decide_fifo(policy, state, observations, group_in_flight, local_free_slots)
    if policy.policy != POLICY_DRR:
        raise ValueError(f"unknown scheduling policy {policy.policy!r}; expected one of {POLICIES}")
    reserved = 0
    for pool in policy_index(policy, state).protected:
        obs = observations.get(pool.pool_id)
        if obs is not None:
            reserved += owed(pool, obs, 0)
    call = Budget(policy.total_concurrency, group_in_flight, local_free_slots, reserved)
    if policy.pools:
        walk(policy.pools, state, observations, call)
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
