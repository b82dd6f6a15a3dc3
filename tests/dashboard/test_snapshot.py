"""A real dispatcher's snapshot against a known state: backlog, caps reached, a paused pool."""

from __future__ import annotations

import asyncio
import contextlib
import time

import orjson
import pytest

from runtime.producer import Producer
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dashboard_live import dispatcher_running, two_pools
from tests.support.dispatching import slow_call, wait_until


@pytest.fixture
async def sim():
    async with SimulatorServer(SimulatorConfig()) as server:
        yield server


async def test_snapshot_reports_backlog_caps_pause_and_active_requests(aredis, keys, sim) -> None:
    config = two_pools(sim.url, paused_backfill=True)
    async with (
        dispatcher_running(aredis, keys, config) as dispatcher,
        Producer(aredis, keys=keys, producer_id="prod-1") as producer,
    ):
        calls = [
            asyncio.create_task(producer.submit(slow_call(1500), pool_id="interactive", timeout=30))
            for _ in range(7)
        ] + [
            asyncio.create_task(producer.submit(slow_call(10), pool_id="backfill", timeout=30))
            for _ in range(3)
        ]

        def settled() -> bool:
            views = dispatcher.last_views
            return (
                len(dispatcher.running) == 4
                and views.get("interactive") is not None
                and views["interactive"].backlog == 3
                and views.get("backfill") is not None
                and views["backfill"].backlog == 3
            )

        await wait_until(settled)

        async def skips_counted_and_snapshot_stored() -> bool:
            pools = {p["pool_id"]: p for p in dispatcher.snapshot()["pools"]}
            return (
                pools["interactive"]["skips"].get("pool_cap", 0) > 0
                and pools["backfill"]["skips"].get("paused", 0) > 0
                and (pools["interactive"]["oldest_pending_age_s"] or 0) > 0.2
                and bool(await aredis.exists(keys.snapshot("g", "d1")))
            )

        await wait_until(skips_counted_and_snapshot_stored, what="skips counted and the snapshot stored")
        snap = dispatcher.snapshot()
        stored = orjson.loads(await aredis.get(keys.snapshot("g", "d1")))
        ttl_ms = await aredis.pttl(keys.snapshot("g", "d1"))
        for task in calls:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*calls, return_exceptions=True)

    assert snap["group_id"] == "g" and snap["dispatcher_id"] == "d1" and snap["gateway_id"] == "gw-test"
    assert snap["policy"] == "drr" and snap["total_concurrency"] == 8 and snap["config_version"] == 1
    assert snap["valkey_ok"] is True and snap["stopping"] is False
    # Which Valkey (the address its hot path connected to, never credentials) and since when.
    kwargs = aredis.connection_pool.connection_kwargs
    assert snap["valkey"] == f"{kwargs['host']}:{kwargs['port']}" and "@" not in snap["valkey"]
    assert snap["up_since"] - 5 <= snap["valkey_reconnected_at"] <= snap["at"]
    assert stored["valkey"] == snap["valkey"]
    assert abs(snap["at"] - time.time()) < 5 and snap["up_since"] <= snap["at"]
    assert snap["in_flight"] == 4 and snap["group_in_flight"] == 4
    interactive, backfill = snap["pools"]
    assert interactive["pool_id"] == "interactive" and interactive["display_name"] == "Interactive"
    assert (interactive["weight"], interactive["min_concurrent"], interactive["max_concurrent"]) == (4, 2, 4)
    assert interactive["queue_depth"] == 3  # 7 submitted, 4 running (the pool's cap)
    assert interactive["in_flight"] == 4 and interactive["in_flight_local"] == 4
    assert interactive["paused"] is False
    assert interactive["head_cost"] == 1
    assert interactive["oldest_pending_age_s"] > 0.2
    assert interactive["skips"].get("pool_cap", 0) > 0
    assert interactive["launched"] == 4
    assert isinstance(interactive["deficit"], int)
    assert backfill["paused"] is True
    assert backfill["queue_depth"] == 3 and backfill["in_flight"] == 0 and backfill["launched"] == 0
    assert backfill["skips"].get("paused", 0) > 0
    assert len(snap["active"]) == 4
    for item in snap["active"]:
        assert item["pool_id"] == "interactive" and item["producer_id"] == "prod-1"
        assert item["model"] == "sim-model" and item["stage"] == "executing" and item["age_s"] >= 0
    # The copy kept in Valkey for first paint has the same shape and a short TTL.
    assert stored["dispatcher_id"] == "d1" and [p["pool_id"] for p in stored["pools"]] == [
        "interactive",
        "backfill",
    ]
    assert 0 < ttl_ms <= 10_000
    # A stopped dispatcher removes its snapshot: it no longer counts as running.
    assert await aredis.exists(keys.snapshot("g", "d1")) == 0


async def test_active_requests_report_queue_wait_and_execution_apart(aredis, keys, sim) -> None:
    """The fifth call waits in its queue for a slot: its wait is not counted as execution time."""
    async with (
        dispatcher_running(aredis, keys, two_pools(sim.url)) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        calls = [
            asyncio.create_task(producer.submit(slow_call(700), pool_id="interactive", timeout=30))
            for _ in range(5)
        ]

        def waited_one() -> dict | None:
            return next((a for a in dispatcher.snapshot()["active"] if a["queue_wait_s"] >= 0.5), None)

        try:
            late = await wait_until(waited_one, timeout=10)
        finally:
            await asyncio.gather(*calls, return_exceptions=True)
    assert late["execution_s"] < 0.5  # it has only just started
    assert late["age_s"] == pytest.approx(late["queue_wait_s"] + late["execution_s"], abs=0.01)
