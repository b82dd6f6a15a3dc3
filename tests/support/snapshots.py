"""Dashboard snapshots as dispatchers publish them, built field by field for merge and view tests."""

from __future__ import annotations

from typing import Any


def pool(pool_id: str, **values: Any) -> dict[str, Any]:
    base = {
        "pool_id": pool_id, "display_name": pool_id, "weight": 1, "min_concurrent": 0, "max_concurrent": 8,
        "max_burst_per_visit": 1, "enabled": True, "paused": False, "endpoint": "http://sim/v1",
        "queue_depth": 0, "in_flight": 0, "in_flight_local": 0, "oldest_pending_age_s": None,
        "head_cost": None, "deficit": 0, "skips": {}, "launched": 0, "cost_dispatched": 0,
    }  # fmt: skip
    return {**base, **values}


def snap(dispatcher_id: str, at: float, pools: list[dict[str, Any]], **values: Any) -> dict[str, Any]:
    base = {
        "schema": 1, "at": at, "group_id": "g", "dispatcher_id": dispatcher_id, "gateway_id": "gw-1",
        "policy": "drr", "config_version": 7, "total_concurrency": 16, "concurrency": 8,
        "up_since": at - 100, "valkey_ok": True, "stopping": False, "in_flight": 0, "group_in_flight": 0,
        "completed": 0, "failed": {}, "dropped": {}, "pools": pools, "active": [],
    }  # fmt: skip
    return {**base, **values}
