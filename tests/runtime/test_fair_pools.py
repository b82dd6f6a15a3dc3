"""DRR across pools on real Valkey with real dispatchers: ratios, pausing, live weights, several
dispatcher processes sharing caps, and a SIGKILLed dispatcher's slots coming back after its lease."""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import replace

import pytest

from runtime.producer import Producer
from runtime.queue import groups
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatcher_process import start_dispatcher, stop
from tests.support.dispatching import running_dispatcher, wait_until
from tests.support.queueing import fill, wait_queued


def two_pools(
    url: str,
    *,
    interactive: int = 4,
    backfill: int = 1,
    total: int = 4,
    paused: bool = False,
    version: int = 1,
) -> GroupConfig:
    return GroupConfig(
        group_id="fair",
        policy="drr",
        total_concurrency=total,
        default_endpoint_url=url,
        version=version,
        pools=(
            PoolConfig("interactive", quantum=interactive, max_concurrent=total),
            PoolConfig("backfill", quantum=backfill, max_concurrent=total, paused=paused),
        ),
    )


@pytest.fixture
async def sim():
    async with SimulatorServer(SimulatorConfig(latency_ms=2)) as server:
        yield server


@pytest.mark.slow
async def test_four_to_one_backlog_dispatches_about_four_to_one(aredis, keys, sim) -> None:
    config = two_pools(sim.url)
    await groups.publish(aredis, keys, config)
    async with Producer(aredis, keys=keys) as producer:
        tasks = await fill(producer, "interactive", 400) + await fill(producer, "backfill", 400)
        await wait_queued(aredis, keys, "backfill", 400)
        async with running_dispatcher(aredis, keys, config, concurrency=4) as dispatcher:
            launched = dispatcher.stats.launched_by_pool
            await wait_until(lambda: launched["interactive"] + launched["backfill"] >= 250, timeout=30)
            ratio = launched["interactive"] / max(1, launched["backfill"])
            await asyncio.gather(*tasks)
    assert 3.3 <= ratio <= 4.8, f"interactive:backfill was {ratio:.2f}, expected about 4"


@pytest.mark.slow
async def test_costs_are_charged_against_weight(aredis, keys, sim) -> None:
    # Equal weights, but every backfill request costs 4 units: interactive should get ~4x the requests.
    config = two_pools(sim.url, interactive=4, backfill=4)
    await groups.publish(aredis, keys, config)
    async with Producer(aredis, keys=keys) as producer:
        tasks = await fill(producer, "interactive", 300) + await fill(producer, "backfill", 300, cost=4)
        await wait_queued(aredis, keys, "backfill", 300)
        async with running_dispatcher(aredis, keys, config, concurrency=4) as dispatcher:
            launched = dispatcher.stats.launched_by_pool
            await wait_until(lambda: launched["interactive"] >= 200, timeout=30)
            ratio = launched["interactive"] / max(1, launched["backfill"])
            cost_ratio = (
                dispatcher.stats.cost_by_pool["interactive"] / dispatcher.stats.cost_by_pool["backfill"]
            )
            await asyncio.gather(*tasks)
    assert 3.2 <= ratio <= 5.0 and 0.8 <= cost_ratio <= 1.25


async def test_paused_pool_keeps_its_queue_until_resumed(aredis, keys, sim) -> None:
    config = two_pools(sim.url, paused=True)
    await groups.publish(aredis, keys, config)
    async with Producer(aredis, keys=keys) as producer:
        backfill = await fill(producer, "backfill", 20)
        await wait_queued(aredis, keys, "backfill", 20)
        async with running_dispatcher(aredis, keys, config) as dispatcher:
            interactive = await fill(producer, "interactive", 20)
            await asyncio.gather(*interactive)
            rounds = dispatcher.stats.rounds
            await wait_until(
                lambda: dispatcher.stats.rounds >= rounds + 5, what="more rounds after interactive"
            )
            assert await aredis.llen(keys.requests("backfill")) == 20
            assert dispatcher.stats.skips[("backfill", "paused")] > 0
            assert dispatcher.snapshot()["pools"][1]["paused"] is True
            await groups.publish(
                aredis,
                keys,
                replace(config, version=2, pools=(config.pools[0], replace(config.pools[1], paused=False))),
            )
            await asyncio.wait_for(asyncio.gather(*backfill), 10)
    assert await aredis.llen(keys.requests("backfill")) == 0


@pytest.mark.slow
async def test_weight_change_reaches_a_running_dispatcher_and_changes_the_ratio(aredis, keys, sim) -> None:
    config = two_pools(sim.url, interactive=1, backfill=1)
    await groups.publish(aredis, keys, config)
    async with Producer(aredis, keys=keys) as producer:
        tasks = await fill(producer, "interactive", 600) + await fill(producer, "backfill", 600)
        await wait_queued(aredis, keys, "backfill", 600)
        async with running_dispatcher(aredis, keys, config, concurrency=4) as dispatcher:
            launched = dispatcher.stats.launched_by_pool
            await wait_until(lambda: launched["interactive"] + launched["backfill"] >= 150, timeout=30)
            before = dict(launched)
            even = before["interactive"] / before["backfill"]
            published_at = time.monotonic()
            await groups.publish(aredis, keys, two_pools(sim.url, interactive=4, backfill=1, version=2))
            await wait_until(lambda: dispatcher.config.version == 2, timeout=2)
            assert time.monotonic() - published_at < 2.0
            start = dict(launched)
            await wait_until(
                lambda: launched["interactive"] + launched["backfill"] - sum(start.values()) >= 250,
                timeout=30,
            )
            after = (launched["interactive"] - start["interactive"]) / (
                launched["backfill"] - start["backfill"]
            )
            await asyncio.gather(*tasks)
    assert 0.7 <= even <= 1.4
    assert 3.2 <= after <= 5.0


@pytest.mark.slow
@pytest.mark.parametrize("processes", [2, 3])
async def test_several_dispatcher_processes_share_caps_and_never_run_a_request_twice(
    aredis, keys, valkey_url, processes
) -> None:
    total, caps = 6, {"interactive": 4, "backfill": 3}
    config = GroupConfig(
        group_id="multi",
        policy="drr",
        total_concurrency=total,
        version=1,
        pools=(
            PoolConfig("interactive", quantum=2, max_concurrent=caps["interactive"]),
            PoolConfig("backfill", quantum=1, max_concurrent=caps["backfill"]),
        ),
    )
    async with SimulatorServer(SimulatorConfig()) as sim:
        await groups.publish(aredis, keys, replace(config, default_endpoint_url=sim.url))
        procs = [start_dispatcher(valkey_url, keys.prefix, "multi", f"d{i}") for i in range(processes)]
        try:
            async with Producer(aredis, keys=keys) as producer:
                tasks = await fill(producer, "interactive", 150, latency_ms=15)
                tasks += await fill(producer, "backfill", 150, latency_ms=15)
                results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        finally:
            codes = stop(procs)
    assert codes == [0] * processes
    assert len(results) == 300
    assert set(sim.calls_by_user.values()) == {1} and len(sim.calls_by_user) == 300
    assert sim.peak_active <= total
    assert sim.peak_active_by_model["interactive"] <= caps["interactive"]
    assert sim.peak_active_by_model["backfill"] <= caps["backfill"]
    assert sim.peak_active >= 4  # the processes really ran calls side by side
    snapshots = await aredis.keys(keys.snapshot_pattern("multi"))
    assert snapshots == []  # each stopped dispatcher removed its live snapshot


@pytest.mark.slow
async def test_killed_dispatcher_frees_its_slots_after_its_lease(aredis, keys, valkey_url) -> None:
    lease_s = 2.0
    async with SimulatorServer(SimulatorConfig()) as sim:
        config = GroupConfig(
            group_id="lease",
            policy="drr",
            total_concurrency=2,
            default_endpoint_url=sim.url,
            version=1,
            pools=(PoolConfig("default", max_concurrent=2),),
        )
        await groups.publish(aredis, keys, config)
        victim = start_dispatcher(valkey_url, keys.prefix, "lease", "victim", lease_s=lease_s)
        async with Producer(aredis, keys=keys) as producer:
            held = await fill(producer, "default", 2, latency_ms=30_000)
            await wait_until(lambda: sim.peak_active == 2, timeout=10)
            victim.send_signal(signal.SIGKILL)
            victim.wait(5)
            killed_at = time.monotonic()
            assert await aredis.zcard(keys.group_inflight("lease")) == 2  # the dead process's leases
            waiting = await fill(producer, "default", 1)
            async with running_dispatcher(aredis, keys, config, lease_s=lease_s) as survivor:
                await asyncio.wait_for(waiting[0], 10)
                freed_after = time.monotonic() - killed_at
                assert survivor.stats.skips[("default", "pool_cap")] > 0  # the dead leases still count
            for task in held:
                task.cancel()
    assert lease_s - 0.5 <= freed_after <= lease_s + 3.0
