"""merge_snapshots and friends: pure functions, tested with hand-made snapshots."""

from __future__ import annotations

from typing import Any

import pytest

from dashboard.merge import (
    STALE_AFTER_S,
    counter_totals,
    live_snapshots,
    merge_snapshots,
    with_configured_pools,
)
from dashboard.publisher import group_name
from dashboard.reasons import counter_rows, legend
from runtime.dispatch.stats import DROP_REASONS
from runtime.queue.keys import SNAPSHOT_TTL_S
from tests.support.snapshots import pool, snap

NOW = 1_700_000_000.0


def active(request_id: str, age: float) -> dict[str, Any]:
    return {"request_id": request_id, "pool_id": "a", "producer_id": "p", "model": "m", "stage": "executing",
            "age_s": age}  # fmt: skip


def test_no_snapshots_means_no_dispatcher_and_a_stale_feed() -> None:
    view = merge_snapshots([], now=NOW)
    assert view["dispatchers_running"] == 0
    assert view["stale"] is True
    assert view["age_s"] is None
    assert view["pools"] == [] and view["active"] == [] and view["dispatchers"] == []
    assert view["completed"] == 0 and view["failed"] == {} and view["dropped"] == {}


def test_two_dispatchers_merge_shared_figures_from_the_freshest_and_sum_their_own() -> None:
    older = snap(
        "d1", NOW - 1.0,
        [pool("a", queue_depth=50, in_flight=3, in_flight_local=2, deficit=4, skips={"credit": 2},
              launched=10, oldest_pending_age_s=9.0, head_cost=3),
         pool("b", queue_depth=1, in_flight=0, deficit=1)],
        in_flight=2, group_in_flight=3, completed=10, failed={"backend_timeout": 1},
        dropped={"expired": 2}, active=[active("r1", 1.0), active("r2", 5.0)],
    )  # fmt: skip
    newer = snap(
        "d2", NOW - 0.2,
        [pool("a", queue_depth=40, in_flight=4, in_flight_local=2, deficit=7,
              skips={"credit": 1, "pool_cap": 5}, launched=5, oldest_pending_age_s=8.5, head_cost=2),
         pool("b", queue_depth=0, in_flight=1, in_flight_local=1, deficit=0)],
        in_flight=3, group_in_flight=5, completed=4, failed={"backend_timeout": 2, "backend_http": 1},
        dropped={"expired": 1, "malformed": 1}, active=[active("r3", 3.0)], gateway_id="gw-2",
    )  # fmt: skip
    view = merge_snapshots([older, newer], now=NOW)
    assert view["dispatchers_running"] == 2
    assert view["stale"] is False and view["age_s"] == 0.2
    a, b = view["pools"]
    assert (a["pool_id"], b["pool_id"]) == ("a", "b")
    assert a["queue_depth"] == 40 and a["in_flight"] == 4  # shared: the freshest observation
    assert a["oldest_pending_age_s"] == 8.5 and a["head_cost"] == 2
    assert a["in_flight_local"] == 4 and a["launched"] == 15  # per dispatcher: summed
    assert a["skips"] == {"credit": 3, "pool_cap": 5} and a["skips_total"] == 8
    assert a["deficit"] == {"d1": 4, "d2": 7}
    assert b["in_flight"] == 1 and b["in_flight_local"] == 1
    assert view["queued"] == 40
    assert view["group_in_flight"] == 5 and view["in_flight"] == 5
    assert view["completed"] == 14
    assert view["failed"] == {"backend_http": 1, "backend_timeout": 3}
    assert view["dropped"] == {"expired": 3, "malformed": 1}
    assert [x["request_id"] for x in view["active"]] == ["r2", "r3", "r1"]  # oldest first
    assert {x["request_id"]: x["dispatcher_id"] for x in view["active"]} == {
        "r1": "d1",
        "r2": "d1",
        "r3": "d2",
    }
    assert [d["dispatcher_id"] for d in view["dispatchers"]] == ["d1", "d2"]
    d1 = view["dispatchers"][0]
    assert d1["gateway_id"] == "gw-1" and d1["completed"] == 10 and d1["failed_total"] == 1
    assert d1["uptime_s"] == 101.0 and d1["age_s"] == 1.0


def test_expired_snapshots_are_not_running_dispatchers() -> None:
    dead = snap("dead", NOW - SNAPSHOT_TTL_S - 1, [pool("a", queue_depth=99)], completed=100)
    alive = snap("alive", NOW - 0.5, [pool("a", queue_depth=3)], completed=1)
    view = merge_snapshots([dead, alive], now=NOW)
    assert view["dispatchers_running"] == 1
    assert view["pools"][0]["queue_depth"] == 3
    assert view["completed"] == 1


@pytest.mark.parametrize(
    "age, stale", [(0.0, False), (STALE_AFTER_S - 0.5, False), (STALE_AFTER_S + 0.5, True)]
)
def test_stale_when_the_newest_snapshot_is_old(age: float, stale: bool) -> None:
    view = merge_snapshots([snap("d", NOW - age, [pool("a")])], now=NOW)
    assert view["stale"] is stale
    assert view["dispatchers_running"] == 1


def test_the_latest_snapshot_of_a_dispatcher_wins() -> None:
    first = snap("d", NOW - 2, [pool("a", queue_depth=10)], completed=1)
    second = snap("d", NOW - 1, [pool("a", queue_depth=5)], completed=2)
    live = live_snapshots([second, first], now=NOW)
    assert live["d"]["completed"] == 2
    view = merge_snapshots([first, second], now=NOW)
    assert view["dispatchers_running"] == 1 and view["completed"] == 2


def test_a_pool_only_one_dispatcher_knows_still_appears() -> None:
    new_config = snap("d2", NOW - 0.1, [pool("a"), pool("c", queue_depth=7)])
    old_config = snap("d1", NOW - 0.3, [pool("a"), pool("b", queue_depth=2)])
    view = merge_snapshots([old_config, new_config], now=NOW)
    assert [p["pool_id"] for p in view["pools"]] == ["a", "c", "b"]
    assert view["pools"][1]["deficit"] == {"d2": 0}


def test_which_valkey_a_dispatcher_uses_and_since_when_older_snapshots_have_neither() -> None:
    new = snap("d1", NOW - 1, [], valkey="10.0.0.5:6379", valkey_reconnected_at=NOW - 30)
    old = snap("d2", NOW - 1, [])  # a dispatcher from before the fields existed
    rows = {row["dispatcher_id"]: row for row in merge_snapshots([new, old], now=NOW)["dispatchers"]}
    assert (rows["d1"]["valkey"], rows["d1"]["valkey_reconnected_at"]) == ("10.0.0.5:6379", NOW - 30)
    assert (rows["d2"]["valkey"], rows["d2"]["valkey_reconnected_at"]) == ("", None)


def test_merge_is_pure() -> None:
    snapshots = [snap("d", NOW - 0.1, [pool("a", skips={"credit": 1})], failed={"x": 1})]
    before = repr(snapshots)
    merge_snapshots(snapshots, now=NOW)
    merge_snapshots(snapshots, now=NOW)
    assert repr(snapshots) == before


def test_configured_pools_nobody_observes_show_their_live_queue_length() -> None:
    view = merge_snapshots([snap("d", NOW, [pool("a", queue_depth=2)])], now=NOW)
    configured = [
        {"pool_id": "a", "display_name": "A", "weight": 1, "min_concurrent": 0, "max_concurrent": 8,
         "enabled": True, "paused": False},
        {"pool_id": "off", "display_name": "Off", "weight": 1, "min_concurrent": 0, "max_concurrent": 8,
         "enabled": False, "paused": False},
    ]  # fmt: skip
    merged = with_configured_pools(view, pools=configured, queue_lengths={"a": 99, "off": 12})
    assert [p["pool_id"] for p in merged["pools"]] == ["a", "off"]
    assert merged["pools"][0]["queue_depth"] == 2  # observed pools keep the dispatcher's figure
    off = merged["pools"][1]
    assert off["queue_depth"] == 12 and off["in_flight"] is None and off["unobserved"] is True
    assert merged["queued"] == 14


def test_counter_hash_and_rows() -> None:
    totals = counter_totals(
        {
            b"completed": b"12",
            b"failed:backend_timeout": b"2",
            b"dropped:expired": b"3",
            b"valkey_outages": b"1",
        }
    )
    assert totals == {
        "completed": 12, "failed": {"backend_timeout": 2}, "dropped": {"expired": 3}, "unpersisted": {},
        "valkey_outages": 1, "failed_total": 2, "dropped_total": 3,
    }  # fmt: skip
    view = merge_snapshots([snap("d", NOW, [], dropped={"expired": 1})], now=NOW)
    view["totals"] = totals
    rows = counter_rows(view)
    assert len(rows) == len(DROP_REASONS) + 1
    expired = next(r for r in rows if "Expired" in r["label"])
    assert expired["reason"] == "expired" and "deadline" in expired["explanation"]
    assert (expired["live"], expired["total"]) == (1, 3)
    last = rows[-1]
    assert (last["label"], last["live"], last["total"]) == ("Failed: backend_timeout", 0, 2)
    assert last["reason"] == "backend_timeout" and last["explanation"]


@pytest.mark.parametrize(
    "group_id, expected",
    [("demo", "fabric.demo"), ("a-b_c.d", "fabric.a-b_c.d")],
)
def test_channel_group_names(group_id: str, expected: str) -> None:
    assert group_name(group_id) == expected


def test_channel_group_names_are_sanitized_and_kept_apart() -> None:
    one, two = group_name("ünï côde"), group_name("ünï_côde")
    assert one != two
    for name in (one, two, group_name("x" * 300)):
        assert len(name) < 100
        assert all(c.isascii() and (c.isalnum() or c in "-_.") for c in name)


def test_reasons_the_dashboard_does_not_know_yet_still_show_with_their_name() -> None:
    view = merge_snapshots(
        [
            snap(
                "d", NOW, [pool("interactive", skips={"pool_cap": 2, "tenant_quota": 1})], dropped={"shed": 4}
            )
        ],
        now=NOW,
    )
    view["totals"] = counter_totals({b"dropped:shed": b"9"})
    shed = next(r for r in counter_rows(view) if r["reason"] == "shed")
    assert (shed["label"], shed["live"], shed["total"]) == ("Dropped: shed", 4, 9)
    explained = legend(view)
    assert [r["reason"] for r in explained["drop"]][-1] == "shed"
    quota = next(r for r in explained["skip"] if r["reason"] == "tenant_quota")
    assert quota["label"] == "tenant quota" and "tenant_quota" in quota["explanation"]
    pool_cap = next(r for r in explained["skip"] if r["reason"] == "pool_cap")
    assert pool_cap["label"] == "pool at its max"
