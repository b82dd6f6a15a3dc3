"""Producer side of a fair pool (``tenant_fairness`` on, issue 22): pushes onto the tenant's own list.

A fair pool keeps one list per tenant (:meth:`~runtime.queue.keys.KeySpace.tenant_requests`; untagged
traffic is tenant ``*`` on the seed's list), the backlogged tenants in a sorted set scored by their
virtual counter, every tenant's counter in a hash, the weights the submits wrote, and the pool's queued
count in one key (``max_queued`` reads it: summing the lists' lengths would be O(tenants)).
``lua/tenant_push.lua`` applies the pool's admission limits (``lua/_admit.lua``, ADMIT_PUSH's own),
then ``max_queued_per_tenant``, pushes (``lua/_tenant_queue.lua``; ``lua/tenant_push_plain.lua`` alone
when there is nothing to check), and lets the tenant *enter* when its list was empty
(``lua/_enter.lua``, :meth:`runtime.policy.tenants.TenantLedger.enter`). A pool with fairness ``off``
never comes here: its push is the seed's.
"""

from __future__ import annotations

import functools
from typing import Any

from runtime.errors import QueueFull
from runtime.immutable import immutable
from runtime.policy.admission import AdmissionLimits
from runtime.queue.admission import KeyLease, admission_args, queue_full
from runtime.queue.keys import UNTAGGED, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS, KeySpace

__all__ = [
    "REASON_TENANT_QUEUED",
    "TenantPush",
    "plain_push",
    "tenant_push_args",
    "tenant_push_plain_args",
    "tenant_queue_full",
]

REASON_TENANT_QUEUED = "max_queued_per_tenant"
TENANT_RETRY_AFTER_S = 1.0  # a tenant at its cap waits for one of its own requests to start


@immutable
class TenantPush:
    """Who a fair pool's push is for, and that pool's per-tenant cap."""

    tenant: str | None  # None: untagged (tenant ``*``)
    weight: float = 1.0
    max_queued_per_tenant: int | None = None

    @property
    def member(self) -> str:
        return UNTAGGED if self.tenant is None else self.tenant


def plain_push(limits: AdmissionLimits, push: TenantPush, lease: KeyLease | None) -> bool:
    """Whether the push has nothing to check (``lua/tenant_push_plain.lua``): no pool limits, no ingress
    key lease, no per-tenant cap. A paused pool or an open breaker only refuse with ``max_queue_wait_s``
    (``lua/_admit.lua``), as for the seed's plain push."""
    return not limits.bounded and lease is None and push.max_queued_per_tenant is None


@functools.lru_cache(maxsize=1024)
def _plain_keys(keys: KeySpace, pool_id: str) -> tuple[str, ...]:
    """TENANT_PUSH_PLAIN's KEYS after the tenant's list: the same for every push to the pool."""
    return (
        keys.wake_list(pool_id), keys.pool_drain(pool_id), keys.tenants(pool_id),
        keys.tenant_counters(pool_id), keys.tenant_weights(pool_id), keys.pool_queued(pool_id),
    )  # fmt: skip


def tenant_push_plain_args(
    keys: KeySpace, pool_id: str, raw: bytes, push: TenantPush
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of ``lua/tenant_push_plain.lua``."""
    return (
        [keys.tenant_requests(pool_id, push.member), *_plain_keys(keys, pool_id)],
        [raw, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS, push.member, repr(float(push.weight))],
    )


@functools.lru_cache(maxsize=1024)
def _unleased_push(
    keys: KeySpace, pool_id: str, limits: AdmissionLimits
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """What every unleased push to one fair pool under ``limits`` shares: its KEYS but the first (the
    tenant's list) and its ARGV but the first (the envelope) and the tenant's own four. Built once:
    eleven key names per submit were a third of a fair push's producer CPU (bench_tenants ``cost``)."""
    script_keys, args = tenant_push_args(keys, pool_id, b"", limits, TenantPush(None), None, cached=False)
    return tuple(script_keys[1:]), tuple(args[1:-4])


def tenant_push_args(
    keys: KeySpace,
    pool_id: str,
    raw: bytes,
    limits: AdmissionLimits,
    push: TenantPush,
    lease: KeyLease | None = None,
    *,
    cached: bool = True,
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of ``lua/tenant_push.lua``: ADMIT_PUSH's, with the key's place always filled."""
    cap = "" if push.max_queued_per_tenant is None else push.max_queued_per_tenant
    own = [push.member, repr(float(push.weight)), cap, "1" if lease is not None else ""]
    if lease is None and cached:
        shared_keys, shared_args = _unleased_push(keys, pool_id, limits)
        return [keys.tenant_requests(pool_id, push.member), *shared_keys], [raw, *shared_args, *own]
    script_keys, args = admission_args(keys, pool_id, raw, limits, lease, filled=True)
    script_keys[0] = keys.tenant_requests(pool_id, push.member)
    script_keys += [
        keys.tenants(pool_id),
        keys.tenant_counters(pool_id),
        keys.tenant_weights(pool_id),
        keys.pool_queued(pool_id),
    ]
    return script_keys, [*args, *own]


def tenant_queue_full(
    pool_id: str, limits: AdmissionLimits, result: list[Any], push: TenantPush, lease: KeyLease | None
) -> QueueFull:
    """The exception for a refusal of ``lua/tenant_push.lua``: the tenant's own cap names the tenant."""
    reason = result[1].decode() if isinstance(result[1], bytes) else str(result[1])
    if reason != REASON_TENANT_QUEUED:
        return queue_full(pool_id, limits, result, lease.limits if lease is not None else None)
    count, cap = int(result[2]), push.max_queued_per_tenant or 0
    return QueueFull(
        f"tenant {push.member!r} has {count} requests queued in pool {pool_id!r}, its most queued "
        f"(max_queued_per_tenant) is {cap}; retry when one has started",
        pool_id=pool_id,
        reason=REASON_TENANT_QUEUED,
        depth=count,
        limit=float(cap),
        retry_after_s=TENANT_RETRY_AFTER_S,
    )
