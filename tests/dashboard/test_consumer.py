"""The dashboard websocket over a real channels-redis layer on the test Valkey, fed by real dispatchers."""

from __future__ import annotations

import asyncio
import time

import pytest
from django.contrib.auth.models import AnonymousUser

from dashboard.publisher import snapshot_sink
from runtime.producer import Producer
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dashboard_live import dispatcher_running, two_pools
from tests.support.dashboard_socket import communicator, view_where
from tests.support.dispatching import CALL

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def sim():
    async with SimulatorServer(SimulatorConfig()) as server:
        yield server


async def test_snapshots_of_two_dispatchers_reach_the_browser_merged(
    aredis, keys, sim, fabric, staff
) -> None:
    comm = communicator(staff)
    connected, _ = await comm.connect()
    assert connected
    first = (await comm.receive_json_from(timeout=5))["view"]
    assert first["group_id"] == "g" and first["dispatchers_running"] == 0
    assert [p["pool_id"] for p in first["pools"]] == ["interactive", "backfill"]  # from the configuration
    assert first["pools"][0]["admin_url"].startswith("/admin/pools/pool/")

    sink = snapshot_sink()
    config = two_pools(sim.url)
    async with dispatcher_running(aredis, keys, config, dispatcher_id="d1", sink=sink):
        one = await view_where(comm, lambda v: v["dispatchers_running"] == 1)
        assert one["dispatchers"][0]["dispatcher_id"] == "d1"
        assert one["pools"][0]["deficit"].keys() == {"d1"}
        async with dispatcher_running(aredis, keys, config, dispatcher_id="d2", sink=sink):
            two = await view_where(comm, lambda v: v["dispatchers_running"] == 2)
            assert [d["dispatcher_id"] for d in two["dispatchers"]] == ["d1", "d2"]
            assert two["pools"][0]["deficit"].keys() == {"d1", "d2"}
            assert not two["stale"]
    assert sink.sent > 0 and sink.failed == 0
    # Both stopped and removed their snapshots: the next refresh from Valkey shows nobody running.
    gone = await view_where(comm, lambda v: v["dispatchers_running"] == 0, timeout=6)
    assert gone["stale"] is True
    await comm.disconnect()


async def test_queue_depth_reaches_the_browser_live(aredis, keys, sim, fabric, staff) -> None:
    comm = communicator(staff)
    assert (await comm.connect())[0]
    await comm.receive_json_from(timeout=5)
    config = two_pools(sim.url, paused_backfill=True)
    async with (
        dispatcher_running(aredis, keys, config, sink=snapshot_sink()),
        Producer(aredis, keys=keys) as producer,
    ):
        tasks = [asyncio.create_task(producer.submit(CALL, pool_id="backfill", timeout=30)) for _ in range(5)]
        view = await view_where(comm, lambda v: v["pools"][1]["queue_depth"] == 5)
        assert view["pools"][1]["paused"] is True and view["queued"] == 5
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await comm.disconnect()


async def test_an_event_alone_reaches_the_browser_through_the_channel_layer(fabric, staff) -> None:
    """A snapshot that exists only as a channel-layer event (nothing in Valkey) still shows up."""
    from tests.support.snapshots import pool, snap

    comm = communicator(staff)
    assert (await comm.connect())[0]
    await comm.receive_json_from(timeout=5)
    sink = snapshot_sink()
    await sink(snap("ghost", time.time(), [pool("interactive", queue_depth=11)]))
    view = await view_where(comm, lambda v: v["dispatchers_running"] == 1, timeout=1.5)
    assert view["dispatchers"][0]["dispatcher_id"] == "ghost"
    assert view["pools"][0]["queue_depth"] == 11
    assert sink.sent == 1
    await comm.disconnect()


@pytest.mark.parametrize("who, code", [("anonymous", 4401), ("visitor", 4403)])
async def test_anonymous_and_non_staff_are_refused(fabric, visitor, who: str, code: int) -> None:
    comm = communicator(AnonymousUser() if who == "anonymous" else visitor)
    connected, _ = await comm.connect()
    assert connected  # accepted only to deliver the close code to the browser
    closed = await comm.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": code}
    await comm.wait()


async def test_unknown_group_is_refused(fabric, staff) -> None:
    comm = communicator(staff, group_id="nope")
    await comm.connect()
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4404}
    await comm.wait()
