"""The dashboard while Valkey stops answering without closing its sockets (SIGSTOP: a silent partition)."""

from __future__ import annotations

import time

import pytest

from dashboard.merge import STALE_AFTER_S, merge_snapshots
from pools import connections
from tests.support.dashboard_live import point_dashboard_at
from tests.support.dashboard_socket import communicator, view_where
from tests.support.snapshots import pool, snap
from tests.support.valkey_freeze import stopped

HEALTH_S = 1.0
NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("reported_ok", "age_s", "shown_ok"),
    [
        (True, 0.0, True),
        (True, STALE_AFTER_S, True),
        # Cut off from Valkey, a dispatcher cannot publish that it is: its last snapshot said "ok".
        (True, STALE_AFTER_S + 0.1, False),
        (False, 0.0, False),
        (False, STALE_AFTER_S + 1, False),
    ],
)
def test_a_dispatcher_not_heard_from_for_a_while_is_not_shown_with_valkey_ok(
    reported_ok: bool, age_s: float, shown_ok: bool
) -> None:
    view = merge_snapshots([snap("d1", NOW - age_s, [pool("a")], valkey_ok=reported_ok)], now=NOW)
    assert view["dispatchers"][0]["valkey_ok"] is shown_ok


@pytest.fixture
def dashboard_on_private_valkey(settings, private_valkey, keys):
    point_dashboard_at(settings, private_valkey.url, keys)
    settings.DISPATCH_VALKEY_HEALTH_S = HEALTH_S
    yield private_valkey
    connections.valkey_url.cache_clear()


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_the_dashboard_says_valkey_is_unreachable_within_the_health_window_and_recovers(
    dashboard_on_private_valkey, fabric, staff
) -> None:
    server = dashboard_on_private_valkey
    comm = communicator(staff)
    assert (await comm.connect(timeout=10))[0]
    first = (await comm.receive_json_from(timeout=5))["view"]
    assert first["valkey_error"] == ""
    with stopped(server) as since:
        # The next refresh (every REFRESH_S = 2 s) reads Valkey and gives up after HEALTH_S, not hours.
        down = await view_where(comm, lambda v: bool(v["valkey_error"]), timeout=2.0 + 2.5 * HEALTH_S)
        assert time.monotonic() - since < 2.0 + 2.5 * HEALTH_S
        assert [p["pool_id"] for p in down["pools"]] == ["interactive", "backfill"]  # from the configuration
    await view_where(comm, lambda v: v["valkey_error"] == "", timeout=10)
    await comm.disconnect()
