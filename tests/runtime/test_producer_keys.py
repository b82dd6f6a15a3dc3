"""A producer key's limits on the direct path (queueing disabled): no queue, so counted in the process."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from runtime.backends.adapter import OpenAIBackend
from runtime.errors import QueueFull
from runtime.policy.admission import KeyLimits
from runtime.producer import Producer
from runtime.queue.keys import KeySpace
from simulator.server import SimulatorServer
from tests.support.waiting import wait_until

CALL = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_most_in_flight_holds_on_the_direct_path(
    aredis: aioredis.Redis, keys: KeySpace, sim: SimulatorServer
) -> None:
    backend = OpenAIBackend(sim.url)
    key = KeyLimits("1", "direct-key", max_in_flight=1)
    try:
        async with Producer(aredis, keys=keys, direct_backend=backend) as producer:
            slow = asyncio.create_task(
                producer.submit({**CALL, "sim": {"latency_ms": 1500}}, pool_id="p", timeout=10, key=key)
            )
            await wait_until(lambda: sim.running >= 1, what="the slow call at the backend")
            with pytest.raises(QueueFull) as caught:
                await producer.submit(CALL, pool_id="p", timeout=10, key=key)
            assert caught.value.reason == "key_max_in_flight"
            assert "'direct-key' has 1 requests open" in str(caught.value)
            assert (await slow).completion["choices"]
            # Its place is given back when it ends.
            assert (await producer.submit(CALL, pool_id="p", timeout=10, key=key)).completion["choices"]
    finally:
        await backend.aclose()
