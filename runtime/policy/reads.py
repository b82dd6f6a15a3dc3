"""What a scheduling round reads of each pool: pure, like the scheduler (no clock, no I/O).

Reading a pool's head items costs their full size (envelopes can weigh megabytes), so they are read
only for pools that could launch now, and no more than the local free slots could launch. A pool
whose decision launched every head it read, with backlog left behind, is read twice as deep the next
round (:func:`next_depth`), up to :data:`DEEP_READ_MAX` heads and while its heads stay light: a burst
of thousands into free slots then starts in a handful of rounds, not in thousands / ``peek_depth``
(each a round trip), and a pool whose decision took fewer heads than it read goes back to the
configured depth. A pool
that cannot (paused, breaker open, no local slot; the observation script also checks the pool's cap
and the group's total) costs its length and lease count, plus one read of its first item for display
when none is cached. A half-open breaker offers
only as many heads as it has probe slots left, so nothing is claimed that it would then refuse.
"""

from __future__ import annotations

from collections.abc import Mapping

from runtime.immutable import immutable
from runtime.policy.scheduler import (
    SKIP_BREAKER_OPEN,
    SKIP_GROUP_CAP,
    SKIP_LOCAL_CAPACITY,
    SKIP_PAUSED,
    SKIP_POOL_CAP,
    GroupPolicy,
    PoolPolicy,
)

# The deepest a pool is read, and the bytes of heads past which its read stops growing (and above
# which it goes back to the configured depth): a deeper read moves that much more at once.
DEEP_READ_MAX = 128
DEEP_READ_BYTES = 1 << 20


@immutable
class PoolRead:
    """What to read of one pool: up to ``depth`` heads, and none while it is at ``pool_max``."""

    pool_id: str
    depth: int
    pool_max: int
    display_head: bool = False  # read the first item even if the pool cannot launch (nothing cached)


@immutable
class ReadPlan:
    reads: tuple[PoolRead, ...]
    refusals: Mapping[str, str]  # pool id -> why it cannot launch whatever it holds (skip reason)


def base_depth(policy: GroupPolicy, peek_depth: int) -> int:
    """The configured depth: ``peek_depth``, or a pool's burst when that is larger."""
    return max(peek_depth, *(p.max_burst_per_visit for p in policy.pools), 1)


def plan_reads(
    policy: GroupPolicy,
    *,
    peek_depth: int,
    local_free: int,
    allowances: Mapping[str, int | None],
    heads_cached: frozenset[str],
    deeper: Mapping[str, int] | None = None,
) -> ReadPlan:
    """``allowances``: calls each pool's breaker lets through now (None: no limit, 0: open);
    ``heads_cached``: pools whose first item the caller already holds; ``deeper``: pools to read
    deeper than ``peek_depth`` (:func:`next_depth`)."""
    base = base_depth(policy, peek_depth)
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
        # A decision launches at most ``local_free`` calls, so no pool gives more than that many heads:
        # reading (and decoding) more only costs, and in a fleet another dispatcher claims them first,
        # so each head was decoded by up to every dispatcher (2.6 decodes per completion with three).
        depth = min(max(base, deeper.get(pool.pool_id, 0)) if deeper else base, max(local_free, 1))
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


def next_depth(depth: int, *, base: int, read: int, launched: int, backlog_left: int, read_bytes: int) -> int:
    """How deep to read a pool next round, read ``depth`` deep (``base``: the configured depth) this
    round: ``read`` heads of ``read_bytes`` in all, of which the decision launched ``launched``,
    leaving ``backlog_left`` behind them."""
    if read == 0:
        return depth  # not read this round: nothing learnt
    if launched < read or read_bytes > DEEP_READ_BYTES:
        return base  # heads read and left (another pool's turn, a cap), or heavy: reading deeper costs
    if backlog_left > 0 and read >= depth and 2 * read_bytes <= DEEP_READ_BYTES:
        return min(2 * depth, DEEP_READ_MAX)
    return depth
