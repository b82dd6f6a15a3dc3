"""Durable-delivery scenarios: a group whose pools retry, a keyed call, a counter read from Valkey."""

from __future__ import annotations

from runtime.wire.groupconfig import DURABLE, GroupConfig, PoolConfig

LEASE_S = 2.0


def keyed(key: str, **sim: object) -> dict[str, object]:
    """A call the simulator counts under ``key`` (every attempt of one request carries the same key)."""
    return {"model": "sim-model", "messages": [{"role": "user", "content": key}], "sim": {"key": key, **sim}}


def group(endpoint: str, *, delivery: str = DURABLE, **pool: object) -> GroupConfig:
    return GroupConfig(
        group_id="g",
        policy="fifo",
        total_concurrency=64,
        default_endpoint_url=endpoint,
        delivery=delivery,
        pools=(PoolConfig(pool_id="default", max_concurrent=64, **pool),),  # type: ignore[arg-type]
        version=1,
    )


def counted(sredis, keys, name: str) -> int:
    """One of the group's cumulative counters, as the dispatchers flushed them to Valkey."""
    return int(sredis.hget(keys.counters("g"), name) or 0)


RETRYING = {"max_attempts": 3, "retry_backoff_base_s": 0.05, "retry_backoff_cap_s": 0.2}
