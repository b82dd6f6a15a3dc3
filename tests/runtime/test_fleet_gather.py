"""A fleet member gathers freed slots before it takes a wake token (issue 23), but never strands one:
a slot that frees alone is still taken once ``gather_s`` is up, long before the idle poll."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack

from runtime.producer import Producer
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatching import running_dispatcher
from tests.support.queueing import call
from tests.support.waiting import wait_until

GATHER_S = 0.4
LONG_MS = 5000  # no other slot frees while the lone freed one waits
SHORT_MS = 1500  # ends once all six run
IDLE_POLL_S = 10.0  # the poll cannot be what takes the freed slot


async def test_a_slot_that_frees_alone_is_taken_once_the_gather_bound_is_up(aredis, keys) -> None:
    """Two dispatchers of 3 slots fill a group of 6; one call ends early, with one request queued.

    Its dispatcher then has 1 of 3 slots free: below half, so it leaves the wake token alone for
    ``gather_s`` (no sooner), then takes it and launches the queued request (not at the idle poll,
    nor when the long calls end and free a second slot).
    """
    async with SimulatorServer(SimulatorConfig()) as sim, AsyncExitStack() as stack:
        config = GroupConfig(
            group_id="gather", policy="drr", total_concurrency=6, version=1,
            pools=(PoolConfig("p", quantum=1, max_concurrent=6),), default_endpoint_url=sim.url,
        )  # fmt: skip
        fleet = [
            await stack.enter_async_context(
                running_dispatcher(
                    aredis,
                    keys,
                    config,
                    dispatcher_id=f"g{i}",
                    concurrency=3,
                    idle_poll_s=IDLE_POLL_S,
                    gather_s=GATHER_S,
                )
            )
            for i in range(2)
        ]
        # Each registered in the fleet by its first round.
        await wait_until(lambda: _fleet_of(aredis, keys, 2), what="a fleet of two")
        producer = await stack.enter_async_context(Producer(aredis, keys=keys))

        def submit(i: int, latency_ms: int) -> asyncio.Task:
            return asyncio.create_task(producer.submit(call("p", i, latency_ms), pool_id="p", timeout=60))

        tasks = [submit(i, LONG_MS if i else SHORT_MS) for i in range(6)]
        # A member with one slot left free may wait up to GATHER_S for it here too.
        await wait_until(lambda: sum(len(d.running) for d in fleet) == 6, what="six calls running")
        assert all(len(d.queue.fleet_slots) == 2 for d in fleet)  # each knows it is one of two
        tasks.append(submit(6, LONG_MS))
        await wait_until(lambda: sum(len(d.running) for d in fleet) == 5, interval=0.005, what="a slot free")
        freed = time.monotonic()
        await wait_until(
            lambda: sum(sum(d.stats.launched_by_pool.values()) for d in fleet) == 7,
            timeout=IDLE_POLL_S, interval=0.005, what="the queued request launched",
        )  # fmt: skip
        waited = time.monotonic() - freed
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert GATHER_S - 0.15 <= waited <= 2.5, f"the freed slot was taken after {waited:.3f} s"
    assert sim.peak_active <= 6


async def _fleet_of(aredis, keys, n: int) -> bool:
    return await aredis.zcard(keys.group_fleet("gather")) >= n
