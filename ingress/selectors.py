"""Reads of producer keys: what a presented key grants."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from ingress.models import ProducerKey
from runtime.policy.admission import KeyLimits


@dataclass(frozen=True, slots=True)
class KeyGrant:
    """What one enabled producer key allows; the ingress caches these briefly."""

    key_id: int
    name: str
    pools: frozenset[str]
    default_pool: str
    max_in_flight: int | None
    max_queued: int | None
    tenant_weight: float = 1.0  # its share inside a pool with tenant fairness (issue 22)
    allow_sub_tenant: bool = False

    def limits(self) -> KeyLimits | None:
        """The key's limits for the producer's admission script; None when it has none."""
        if self.max_in_flight is None and self.max_queued is None:
            return None
        return KeyLimits(str(self.key_id), self.name, self.max_in_flight, self.max_queued)


def key_digest(raw_key: str) -> str:
    # Keys are 256-bit random tokens, so a plain SHA-256 cannot be brute-forced: no slow hash needed.
    return hashlib.sha256(raw_key.encode()).hexdigest()


def producer_key_grant(*, raw_key: str) -> KeyGrant | None:
    """The grant of an enabled key, None for an unknown or revoked one."""
    key = ProducerKey.objects.filter(key_hash=key_digest(raw_key), enabled=True).first()
    if key is None:
        return None
    return KeyGrant(
        key_id=key.pk,
        name=key.name,
        pools=frozenset(key.pools),
        default_pool=key.default_pool,
        max_in_flight=key.max_in_flight,
        max_queued=key.max_queued,
        tenant_weight=key.tenant_weight,
        allow_sub_tenant=key.allow_sub_tenant,
    )


def tenant_weights(*, tenants: Sequence[str]) -> dict[str, float]:
    """The weight of each ingress tenant (``key-{id}`` or ``key-{id}:{sub}``) whose key's
    ``tenant_weight`` is not 1, for a what-if replay; other tenants weigh 1."""
    key_of = {t: int(k) for t in tenants if (k := t.removeprefix("key-").partition(":")[0]).isdigit()}
    key_of = {t: k for t, k in key_of.items() if t.startswith("key-")}
    weights = dict(ProducerKey.objects.filter(pk__in=set(key_of.values())).values_list("pk", "tenant_weight"))
    return {t: float(weights[k]) for t, k in key_of.items() if weights.get(k, 1.0) != 1.0}
