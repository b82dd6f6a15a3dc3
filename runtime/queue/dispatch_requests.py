"""What the dispatcher's queue scripts take and answer: an observation's views, a claim request, the
turn's end, and the KEYS/ARGV builders of reap, promote and bury (each script's ``.lua`` declares them).

Plain data, no I/O: :mod:`runtime.queue.dispatching` runs the scripts.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import field
from typing import Any

from runtime.immutable import immutable
from runtime.queue import scripts
from runtime.queue.keys import WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS, KeySpace
from runtime.queue.leases import LeaseRecord, item_digest
from runtime.queue.tenant_dispatch import FairView, reap_fair_args

__all__ = [
    "ClaimRequest",
    "Observation",
    "QueueView",
    "ScriptArgs",
    "TurnEnd",
    "bury_args",
    "promote_args",
    "reap_args",
    "reaped",
]


@immutable
class QueueView:
    """What one observation saw of one pool."""

    backlog: int
    heads: tuple[bytes, ...]  # the first items, read for launching (empty when not read)
    in_flight: int
    heads_read: bool = True  # False: the pool could not launch, so its heads were not read
    display_head: bytes | None = None  # the first item, read only to show its age (pool can't launch)


@immutable
class Observation:
    views: dict[str, QueueView]
    group_in_flight: int
    lost: tuple[LeaseRecord, ...]  # records of leases that expired unreleased (reaped this time)
    requeued: tuple[bytes, ...] = ()  # durable envelopes the reap put back at the head of their list
    fair: dict[str, FairView] = field(default_factory=dict)  # fair pools' tenants (their views have no heads)


@immutable
class ClaimRequest:
    pool_id: str
    raw: bytes
    mode: str  # "launch" | "drop"
    lease_member: str = ""
    producer_id: str = ""
    pool_max: int = 0
    group_limit: int = 0
    lease_record: bytes = b""
    protected: int = 0  # this pool's protected slots (min concurrent)
    requeue: bytes = b""  # durable mode: the envelope REAP puts back if the lease expires
    # The group's other protected pools that may claim their slots: (pool id, protected slots).
    reserved_for: tuple[tuple[str, int], ...] = ()
    backend_id: str = ""  # the backend row the call goes to ("" for a bare endpoint URL)
    backend_limit: int | None = None  # its fleet-wide in-flight limit now (None: not checked)


@immutable
class TurnEnd:
    """Giving the group's scheduling turn back (see :mod:`runtime.queue.turn`)."""

    holder: str  # the dispatcher id that took the turn
    left_work: bool  # the round was cut by this dispatcher's own free slots: wake another
    wake_pool: str  # a pool of the group, whose wake list gets that token


ScriptArgs = tuple[list[str], list[Any]]  # a script's KEYS and ARGV


def reap_args(
    keys: KeySpace,
    group_id: str,
    pool_ids: Sequence[str],
    backend_ids: Sequence[str] = (),
    fair_pools: Collection[str] = (),
) -> ScriptArgs:
    """KEYS and ARGV of ``lua/reap.lua`` (which declares them) for a group, its pools and backends;
    ``fair_pools`` (tenant fairness on) get their durable requests requeued onto their tenants' lists."""
    script_keys = [
        keys.group_inflight(group_id),
        keys.lease_records(group_id),
        keys.durable_leases(group_id),
        keys.lease_tokens(group_id),
        *map(keys.pool_inflight, pool_ids),
        *map(keys.backend_inflight, backend_ids),
    ]
    return script_keys, [keys.requests(""), *reap_fair_args(keys, fair_pools)]


def reaped(result: Any) -> tuple[tuple[LeaseRecord, ...], tuple[bytes, ...]]:
    """REAP's answer: the records of the calls lost in flight, and the durable envelopes requeued."""
    lost_raw, requeued_raw = result
    records = (LeaseRecord.decode(raw) for raw in lost_raw)
    return tuple(r for r in records if r is not None), tuple(requeued_raw)


def promote_args(keys: KeySpace, pool_id: str) -> ScriptArgs:
    """KEYS and ARGV of ``lua/promote.lua`` (which declares them) for one pool."""
    return (
        [keys.delayed(pool_id), keys.requests(pool_id), keys.wake_list(pool_id)],
        [scripts.PROMOTE_BATCH, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS],
    )


def bury_args(
    keys: KeySpace,
    raw: bytes,
    *,
    pool_id: str,
    producer_id: str,
    letter: bytes,
    reply: bytes,
    reply_ttl_s: float,
) -> ScriptArgs:
    """KEYS and ARGV of ``lua/bury.lua`` (which declares them): the head ``raw`` of a pool buried as
    ``letter``, its producer answered with ``reply``."""
    script_keys = [
        keys.requests(pool_id),
        keys.dead_letters(pool_id),
        keys.producer_alive(producer_id),
        keys.replies(producer_id),
    ]
    return script_keys, [item_digest(raw), letter, reply, int(reply_ttl_s * 1000)]
