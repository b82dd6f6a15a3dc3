"""The tenant a producer's request belongs to, and what its push needs in a fair pool (issue 22).

A pool with ``tenant_fairness`` ``off`` (the default) gets the seed's push whatever the tenant: the
envelope still carries the tenant, for history. A fair pool's push goes to the tenant's own list
(:mod:`runtime.queue.tenants`); untagged traffic there is tenant ``*`` on the seed's list.
"""

from __future__ import annotations

from opentelemetry import trace

from runtime.immutable import immutable
from runtime.policy.tenants import OFF, validate_tenant_weight
from runtime.queue.keys import UNTAGGED
from runtime.queue.tenants import TenantPush
from runtime.telemetry import semconv
from runtime.wire.groupconfig import PoolConfig
from runtime.wire.tenant import check_tenant

__all__ = ["UNTAGGED_TAG", "TenantTag", "fair_push", "tag_span", "withdraw_member"]


@immutable
class TenantTag:
    """A submit's tenant (None: untagged) and its weight (its ingress key's ``tenant_weight``)."""

    tenant: str | None = None
    weight: float = 1.0

    @classmethod
    def of(cls, tenant: str | None, weight: float) -> TenantTag:
        """Checked: a malformed tenant is MalformedEnvelope, a bad weight ValueError, before any push."""
        return cls(None if tenant is None else check_tenant(tenant, "tenant"), validate_tenant_weight(weight))


UNTAGGED_TAG = TenantTag()


def tag_span(span: trace.Span, tag: TenantTag) -> None:
    """The submit span names the tenant (the dispatch span does too); untagged: no attribute."""
    if tag.tenant is not None:
        span.set_attribute(semconv.TENANT, tag.tenant)


def _fair(pool: PoolConfig | None) -> bool:
    return pool is not None and pool.tenant_fairness != OFF


def fair_push(pool: PoolConfig | None, tag: TenantTag) -> TenantPush | None:
    """The push's tenant part in a fair pool; None in any other (the seed's push)."""
    if pool is None or not _fair(pool):
        return None
    return TenantPush(tag.tenant, tag.weight, pool.max_queued_per_tenant)


def withdraw_member(pool: PoolConfig | None, tag: TenantTag) -> str | None:
    """The tenant whose list a withdrawal searches in a fair pool; None: the seed's list alone."""
    if not _fair(pool):
        return None
    return UNTAGGED if tag.tenant is None else tag.tenant
