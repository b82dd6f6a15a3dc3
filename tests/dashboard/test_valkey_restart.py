"""The dashboard websocket after the Valkey server behind it restarts (real server stopped and started)."""

from __future__ import annotations

import time

import pytest

from dashboard.publisher import snapshot_sink
from pools import connections
from runtime.valkey import embedded
from tests.support.dashboard_live import point_dashboard_at
from tests.support.dashboard_socket import communicator, view_where
from tests.support.snapshots import pool, snap

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def dashboard_on_private_valkey(settings, private_valkey, keys):
    """Everything the consumer touches (snapshot reads, channel layer) on a server the test may restart."""
    point_dashboard_at(settings, private_valkey.url, keys)
    yield private_valkey
    connections.valkey_url.cache_clear()


async def test_first_websocket_after_a_valkey_restart_connects_and_gets_snapshots(
    dashboard_on_private_valkey, fabric, staff
) -> None:
    server = dashboard_on_private_valkey
    before = communicator(staff)
    assert (await before.connect())[0]
    await before.receive_json_from(timeout=5)
    await before.disconnect()

    embedded.stop(server.data_dir)
    embedded.start(server.data_dir, port=server.port)

    after = communicator(staff)
    connected, _ = await after.connect(timeout=10)
    assert connected
    first = (await after.receive_json_from(timeout=5))["view"]
    assert first["group_id"] == "g" and first["valkey_error"] == ""
    # The group membership is live again: an event published after the restart reaches this socket.
    await snapshot_sink()(snap("after-restart", time.time(), [pool("interactive", queue_depth=7)]))
    view = await view_where(after, lambda v: v["dispatchers_running"] == 1, timeout=5)
    assert view["dispatchers"][0]["dispatcher_id"] == "after-restart"
    await after.disconnect()


async def test_websocket_while_valkey_is_down_says_so_and_recovers_when_it_returns(
    dashboard_on_private_valkey, fabric, staff
) -> None:
    server = dashboard_on_private_valkey
    embedded.stop(server.data_dir)
    comm = communicator(staff)
    connected, _ = await comm.connect(timeout=10)
    assert connected  # the browser learns why there are no live figures, instead of a failed handshake
    down = (await comm.receive_json_from(timeout=10))["view"]
    assert down["valkey_error"] and down["dispatchers_running"] == 0
    assert [p["pool_id"] for p in down["pools"]] == ["interactive", "backfill"]  # from the configuration

    embedded.start(server.data_dir, port=server.port)
    await view_where(comm, lambda v: v["valkey_error"] == "", timeout=10)
    # The socket joined its group once Valkey came back: published snapshots reach it again.
    await snapshot_sink()(snap("back", time.time(), [pool("interactive", queue_depth=3)]))
    view = await view_where(comm, lambda v: v["dispatchers_running"] == 1, timeout=5)
    assert view["dispatchers"][0]["dispatcher_id"] == "back"
    await comm.disconnect()
