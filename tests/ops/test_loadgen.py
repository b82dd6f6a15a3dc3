"""The load generator's live line separates real failures from calls cut off by stopping it."""

from __future__ import annotations

from ops.loadgen import LoadStats


def test_calls_cancelled_at_stop_are_not_failures() -> None:
    stats = LoadStats()
    stats.sent["backfill"] = 10
    stats.ok["backfill"] = 7
    stats.failed["backfill:producer_closed"] = 2
    stats.failed["backfill:backend_timeout"] = 1
    stats.wait_s["backfill"] = [0.010, 0.020, 0.030]
    assert stats.line() == "backfill: sent 10 ok 7 failed 1 wait p50 20ms cancelled at stop 2"
