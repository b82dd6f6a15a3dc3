"""The dashboard behind Valkey Sentinel: after the primary is SIGKILLed, the web process's client and the
channel layer (channels-redis' sentinel pool) follow the promoted replica; no process restarts."""

from __future__ import annotations

import time

import pytest
import redis

from dashboard.publisher import snapshot_sink
from pools import connections
from tests.support.dashboard_live import point_dashboard_at
from tests.support.dashboard_socket import communicator, view_where
from tests.support.sentinel_cluster import SentinelCluster
from tests.support.snapshots import pool, snap
from tests.support.waiting import wait_until_sync

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def dashboard_behind_sentinel(settings, sentinel_cluster, keys):
    point_dashboard_at(settings, sentinel_cluster.url, keys)
    yield sentinel_cluster
    connections.valkey_url.cache_clear()


async def test_the_websocket_and_the_web_client_follow_a_failover(
    dashboard_behind_sentinel, fabric, staff
) -> None:
    cluster: SentinelCluster = dashboard_behind_sentinel
    before = communicator(staff)
    assert (await before.connect())[0]
    assert (await before.receive_json_from(timeout=5))["view"]["valkey_error"] == ""
    await snapshot_sink()(snap("before", time.time(), [pool("interactive", queue_depth=1)]))
    await view_where(before, lambda v: v["dispatchers_running"] == 1, timeout=5)
    await before.disconnect()

    old = cluster.kill_primary()
    new = cluster.wait_failover(old)

    def web_client_writes() -> bool:
        try:
            return bool(connections.sync_client().set(connections.key_space().prefix + "probe", "1"))
        except redis.RedisError:
            return False

    wait_until_sync(web_client_writes, timeout=20, what="the web client writing to the new primary")
    with cluster.client(new) as direct:
        assert direct.get(connections.key_space().prefix + "probe") == "1"

    after = communicator(staff)
    connected, _ = await after.connect(timeout=10)
    assert connected
    await view_where(after, lambda v: v["valkey_error"] == "", timeout=10)
    # The channel layer's group membership and publication work on the new primary.
    await snapshot_sink()(snap("after-failover", time.time(), [pool("interactive", queue_depth=7)]))
    view = await view_where(
        after, lambda v: any(d["dispatcher_id"] == "after-failover" for d in v["dispatchers"]), timeout=10
    )
    assert view["valkey_error"] == ""
    await after.disconnect()
