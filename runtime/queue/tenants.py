"""Producer side of a fair pool (``tenant_fairness`` on, issue 22): pushes onto the tenant's own list.

A fair pool keeps one list per tenant (:meth:`~runtime.queue.keys.KeySpace.tenant_requests`; untagged
traffic is tenant ``*`` on the seed's list), the backlogged tenants in a sorted set scored by their
virtual counter, every tenant's counter in a hash, the weights the submits wrote, and the pool's queued
count in one key (``max_queued`` reads it: summing the lists' lengths would be O(tenants)).
``lua/tenant_push.lua`` applies the pool's admission limits (``lua/_admit.lua``, ADMIT_PUSH's own),
then ``max_queued_per_tenant``, pushes, and lets the tenant *enter* when its list was empty
(``lua/_enter.lua``, :meth:`runtime.policy.tenants.TenantLedger.enter`). A pool with fairness ``off``
never comes here: its push is the seed's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.errors import QueueFull
from runtime.policy.admission import AdmissionLimits
from runtime.queue.admission import KeyLease, admission_args, queue_full
from runtime.queue.keys import UNTAGGED, KeySpace

__all__ = ["REASON_TENANT_QUEUED", "TenantPush", "tenant_push_args", "tenant_queue_full"]

REASON_TENANT_QUEUED = "max_queued_per_tenant"
TENANT_RETRY_AFTER_S = 1.0  # a tenant at its cap waits for one of its own requests to start


@dataclass(frozen=True, slots=True)
class TenantPush:
    """Who a fair pool's push is for, and that pool's per-tenant cap."""

    tenant: str | None  # None: untagged (tenant ``*``)
    weight: float = 1.0
    max_queued_per_tenant: int | None = None

    @property
    def member(self) -> str:
        return UNTAGGED if self.tenant is None else self.tenant


def tenant_push_args(
    keys: KeySpace,
    pool_id: str,
    raw: bytes,
    limits: AdmissionLimits,
    push: TenantPush,
    lease: KeyLease | None = None,
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of ``lua/tenant_push.lua``: ADMIT_PUSH's, with the key's place always filled."""
    script_keys, args = admission_args(keys, pool_id, raw, limits, lease)
    script_keys[0] = keys.tenant_requests(pool_id, push.member)
    if lease is None:
        script_keys.append(keys.key_open(""))  # a key nobody writes: the tenant keys keep their places
        args += ["", "", "", "0", keys.pool_inflight("")]
    script_keys += [
        keys.tenants(pool_id),
        keys.tenant_counters(pool_id),
        keys.tenant_weights(pool_id),
        keys.pool_queued(pool_id),
    ]
    cap = "" if push.max_queued_per_tenant is None else push.max_queued_per_tenant
    args += [push.member, repr(float(push.weight)), cap, "1" if lease is not None else ""]
    return script_keys, args


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
