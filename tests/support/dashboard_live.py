"""Helpers: a real dispatcher with a dashboard snapshot sink, and a demo-like two-pool group config."""

from __future__ import annotations

import contextlib
from typing import Any

import redis.asyncio as aioredis

from pools import connections
from runtime.dispatch.dispatcher import Dispatcher
from runtime.queue.keys import KeySpace
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from tests.support.dispatching import running_dispatcher


def two_pools(endpoint: str, *, paused_backfill: bool = False, version: int = 1) -> GroupConfig:
    """Matches the ``fabric`` fixture: interactive (weight 4, min 2, max 4) and backfill (max 4)."""
    return GroupConfig(
        group_id="g",
        policy="drr",
        total_concurrency=8,
        default_endpoint_url=endpoint,
        pools=(
            PoolConfig(pool_id="interactive", display_name="Interactive", quantum=4, min_concurrent=2,
                       max_concurrent=4, max_burst_per_visit=2),
            PoolConfig(pool_id="backfill", quantum=1, max_concurrent=4, paused=paused_backfill),
        ),
        version=version,
    )  # fmt: skip


def dispatcher_running(
    client: aioredis.Redis,
    keys: KeySpace,
    config: GroupConfig,
    *,
    dispatcher_id: str = "d1",
    sink: Any = None,
    **overrides: Any,
) -> contextlib.AbstractAsyncContextManager[Dispatcher]:
    """A real dispatcher with the dashboard's snapshot sink, under a fixed gateway id."""
    return running_dispatcher(
        client,
        keys,
        config,
        snapshot_sink=sink,
        dispatcher_id=dispatcher_id,
        gateway_id="gw-test",
        **overrides,
    )


def point_dashboard_at(settings, url: str, keys: KeySpace) -> None:
    """Valkey reads and the project's channel layer (its own backend class) on ``url`` under ``keys``."""
    connections.valkey_url.cache_clear()
    settings.VALKEY_URL = url
    settings.DISPATCH_KEY_PREFIX = keys.prefix
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": settings.CHANNEL_LAYERS["default"]["BACKEND"],
            "CONFIG": {
                "hosts": [connections.channel_layer_host(url)],
                "prefix": f"{keys.prefix}asgi",
                "capacity": 500,
                "expiry": 30,
            },
        }
    }
