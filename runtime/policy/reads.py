"""What a scheduling round reads of each pool: pure, like the scheduler (no clock, no I/O).

Reading a pool's head items costs their full size (envelopes can weigh megabytes), so they are read
only for pools that could launch now, and no more than the local free slots could launch. A pool
that cannot (paused, breaker open, no local slot; the observation script also checks the pool's cap
and the group's total) costs its length and lease count, plus one read of its first item for display
when none is cached. A half-open breaker offers
only as many heads as it has probe slots left, so nothing is claimed that it would then refuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from runtime.policy.scheduler import (
    SKIP_BREAKER_OPEN,
    SKIP_GROUP_CAP,
    SKIP_LOCAL_CAPACITY,
    SKIP_PAUSED,
    SKIP_POOL_CAP,
    GroupPolicy,
    PoolPolicy,
)


@dataclass(frozen=True, slots=True)
class PoolRead:
    """What to read of one pool: up to ``depth`` heads, and none while it is at ``pool_max``."""

    pool_id: str
    depth: int
    pool_max: int
    display_head: bool = False  # read the first item even if the pool cannot launch (nothing cached)


@dataclass(frozen=True, slots=True)
class ReadPlan:
    reads: tuple[PoolRead, ...]
    refusals: Mapping[str, str]  # pool id -> why it cannot launch whatever it holds (skip reason)


def plan_reads(
    policy: GroupPolicy,
    *,
    peek_depth: int,
    local_free: int,
    allowances: Mapping[str, int | None],
    heads_cached: frozenset[str],
) -> ReadPlan:
    """``allowances``: calls each pool's breaker lets through now (None: no limit, 0: open);
    ``heads_cached``: pools whose first item the caller already holds."""
    depth = max(peek_depth, *(p.max_burst_per_visit for p in policy.pools), 1)
    # A decision launches at most ``local_free`` calls, so no pool gives more than that many heads:
    # reading (and decoding) more only costs, and in a fleet another dispatcher claims them first, so
    # each head was decoded by up to every dispatcher (2.6 decodes per completion with three, issue 23).
    depth = min(depth, max(local_free, 1))
    refusals: dict[str, str] = {}
    reads: list[PoolRead] = []
    for pool in policy.pools:
        limit = allowances.get(pool.pool_id)
        if pool.paused:
            refusals[pool.pool_id] = SKIP_PAUSED
        elif limit == 0:
            refusals[pool.pool_id] = SKIP_BREAKER_OPEN
        elif local_free <= 0:
            refusals[pool.pool_id] = SKIP_LOCAL_CAPACITY
        pool_depth = 0 if pool.pool_id in refusals else depth if limit is None else min(depth, limit)
        display = pool.pool_id not in heads_cached
        reads.append(PoolRead(pool.pool_id, pool_depth, pool.max_concurrent, display))
    return ReadPlan(tuple(reads), refusals)


def unread_skip(pool: PoolPolicy, in_flight: int, refusal: str | None) -> str:
    """The skip reason of a backlogged pool whose heads were not read: the caller's refusal, else the
    cap the observation script found reached."""
    if refusal is not None:
        return refusal
    return SKIP_POOL_CAP if in_flight >= pool.max_concurrent else SKIP_GROUP_CAP
