"""Builds the runtime's frozen settings from Django settings: the one bridge between the two."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from django.conf import settings

from pools.connections import key_space, valkey_url
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


def start_tracing(service_name: str) -> Callable[[], None]:
    """Installs this process's span exporter to the Valkey stream (and OTLP when configured); returns
    its shutdown callable. Every process that submits or runs requests calls it once."""
    from runtime.telemetry.tracing import configure_tracing, otlp_configured, shutdown_tracing

    provider = configure_tracing(
        redis_url=valkey_url(),
        keys=key_space(),
        service_name=service_name,
        otlp=otlp_configured(os.environ),
        store_content=bool(settings.HISTORY_STORE_CONTENT),
    )
    return lambda: shutdown_tracing(provider, 5.0)
