"""A dispatcher opens as many backend connections as it has slots: long calls never wait for one."""

from __future__ import annotations

import asyncio

import pytest

from runtime.producer import Producer
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatching import one_pool_group, running_dispatcher, slow_call, wait_until

pytestmark = pytest.mark.slow

SLOTS = 300  # over the adapter's default of 256 connections per endpoint


async def test_every_slot_runs_a_call_at_the_backend_at_once(aredis, keys) -> None:
    async with SimulatorServer(SimulatorConfig()) as sim:
        config = one_pool_group(sim.url, total=SLOTS, max_concurrent=SLOTS)
        async with (
            running_dispatcher(aredis, keys, config, concurrency=SLOTS),
            Producer(aredis, keys=keys) as producer,
        ):
            calls = [
                asyncio.create_task(producer.submit(slow_call(5_000), pool_id="default", timeout=60))
                for _ in range(SLOTS)
            ]
            # Connection-bound, only 256 would run and the rest wait for a free connection.
            await wait_until(lambda: sim.running == SLOTS, timeout=30, what=f"{SLOTS} calls running")
            results = await asyncio.gather(*calls)
    assert len(results) == SLOTS
