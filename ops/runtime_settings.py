"""Builds the runtime's frozen settings from Django settings: the one bridge between the two."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from runtime.config import DispatcherSettings, ProducerSettings
from runtime.policy.cost import CostModel


def cost_model() -> CostModel:
    return CostModel(
        per_image=settings.DISPATCH_COST_PER_IMAGE,
        per_page=settings.DISPATCH_COST_PER_PAGE,
        maximum=settings.DISPATCH_COST_MAX,
    )


def dispatcher_settings(group_id: str, **overrides: Any) -> DispatcherSettings:
    values: dict[str, Any] = {
        "group_id": group_id,
        "gateway_id": settings.DISPATCH_GATEWAY_ID,
        "concurrency": settings.DISPATCH_CONCURRENCY,
        "shutdown_grace_s": settings.DISPATCH_SHUTDOWN_GRACE_S,
        "lease_s": settings.DISPATCH_LEASE_S,
        "backend_timeout_s": settings.DISPATCH_BACKEND_TIMEOUT_S,
        "valkey_health_s": settings.DISPATCH_VALKEY_HEALTH_S,
        "cost": cost_model(),
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return DispatcherSettings(**values)


def producer_settings(**overrides: Any) -> ProducerSettings:
    values: dict[str, Any] = {
        "alive_ttl_s": settings.DISPATCH_PRODUCER_ALIVE_TTL_S,
        "alive_refresh_s": settings.DISPATCH_PRODUCER_ALIVE_REFRESH_S,
        "max_envelope_bytes": settings.DISPATCH_MAX_ENVELOPE_BYTES,
        "valkey_health_s": settings.DISPATCH_VALKEY_HEALTH_S,
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return ProducerSettings(**values)
