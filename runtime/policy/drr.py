"""Deficit Round Robin over a fabric group's ring of pools (see :mod:`runtime.policy.scheduler`).

Pure: the walk, the passes, the visits of one pool, the no-spin jump and the credit bookkeeping, all
updating the caller's :class:`~runtime.policy.decisions.SchedulerState` in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from runtime.policy.decisions import (
    GLOBAL_REASONS,
    SKIP_NO_CREDIT,
    Budget,
    GroupPolicy,
    Launch,
    PolicyIndex,
    PoolObservation,
    PoolPolicy,
    SchedulerState,
)

_BURST = "burst"  # internal stop reasons of a visit
_CREDIT = "credit"
_EMPTY = "empty"
_EXHAUSTED = "exhausted"  # peeked heads used up, no credit left: the visit is over anyway
_SUSPENDED = "suspended"  # peeked heads used up with credit left: resume this visit next call
_CUT = GLOBAL_REASONS | {_SUSPENDED}  # stop the walk here; the cursor stays on this pool


def policy_index(policy: GroupPolicy, state: SchedulerState) -> PolicyIndex:
    index = state.index
    if index is None or index.policy is not policy:
        index = PolicyIndex(policy, tuple(p for p in policy.pools if p.min_concurrent > 0))
        state.index = index
    return index


def walk(
    pools: tuple[PoolPolicy, ...],
    state: SchedulerState,
    observations: Mapping[str, PoolObservation],
    call: Budget,
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
    call: Budget,
    starved: _Starved,
) -> int | None:
    """Visit every ring position once from ``start``; return the position cut off by capacity, if any."""
    last = len(pools) - 1
    get = observations.get
    credited, deficits, max_cost, refunded = state.credited, state.deficits, state.max_cost, state.refunded
    for pos in _ring_orders(last + 1)[start]:
        pool = pools[pos]
        pid = pool.pool_id
        obs = get(pid)
        if obs is None or obs.backlog <= 0:
            # Idle: leaves the rotation with no credit (looking first is cheaper: most idle pools have none).
            if pid in credited or pid in deficits or pid in max_cost or pid in refunded:
                state.forget(pid)
        elif obs.heads and _visit(pos, pool, obs, state, call, starved) in _CUT:
            return pos
        if pos == last:
            _end_pass(state, observations)
    return None


@cache
def _ring_orders(n: int) -> tuple[tuple[int, ...], ...]:
    """For each start, the ring positions of a pass from it (a pass runs on every decision)."""
    return tuple((*range(start, n), *range(start)) for start in range(n))


def _visit(
    pos: int,
    pool: PoolPolicy,
    obs: PoolObservation,
    state: SchedulerState,
    call: Budget,
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
    seen = obs.heads[index].cost
    known = state.max_cost.get(pid, 0)
    if known > seen:
        seen = known
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


def _serve(pool: PoolPolicy, obs: PoolObservation, state: SchedulerState, call: Budget) -> str:
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
    if state.deficits:
        get = observations.get
        stale = [pid for pid in state.deficits if (obs := get(pid)) is None or obs.backlog <= 0]
        for pid in stale:
            state.forget(pid)
    if not state.carry:
        state.round += 1
    state.carry = False


_Starved = list[tuple[int, PoolPolicy, PoolObservation]]  # (ring position, pool, observation)


def _record_starved(call: Budget, starved: _Starved) -> None:
    for _, pool, _obs in starved:
        call.skip(pool.pool_id, SKIP_NO_CREDIT)


def _jump(state: SchedulerState, call: Budget, starved: _Starved) -> tuple[int, bool]:
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
