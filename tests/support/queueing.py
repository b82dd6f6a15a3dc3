"""Calls queued into pools through a real producer, and waiting for a queue to reach a length."""

from __future__ import annotations

import asyncio

from runtime.producer import Producer
from runtime.wire.contract import Metadata
from tests.support.waiting import wait_until


def call(pool_id: str, i: int, latency_ms: float = 0) -> dict:
    # model = pool id so the simulator can count per-pool concurrency; user = unique id per request.
    return {
        "model": pool_id,
        "messages": [{"role": "user", "content": f"{pool_id} {i}"}],
        "user": f"{pool_id}-{i}",
        "sim": {"latency_ms": latency_ms},
    }


async def fill(
    producer: Producer, pool_id: str, n: int, latency_ms: float = 0, cost: int | None = None
) -> list[asyncio.Task]:
    md = Metadata(cost_units=cost) if cost else None
    return [
        asyncio.create_task(
            producer.submit(call(pool_id, i, latency_ms), pool_id=pool_id, timeout=120, metadata=md)
        )
        for i in range(n)
    ]


async def wait_queued(client, keys, pool_id: str, n: int) -> None:
    async def enough() -> bool:
        return await client.llen(keys.requests(pool_id)) >= n

    await wait_until(enough, timeout=20, what=f"{n} calls queued in {pool_id}")
