"""FIFO over a fabric group: heads of all pools launched in global arrival order (see
:mod:`runtime.policy.scheduler`)."""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from runtime.policy.decisions import (
    GLOBAL_REASONS,
    Budget,
    Decision,
    GroupPolicy,
    PoolObservation,
    SchedulerState,
)


def decide_fifo(
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
    call = Budget(policy.total_concurrency, group_in_flight, local_free_slots, 0)
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
            if reason in GLOBAL_REASONS:
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
