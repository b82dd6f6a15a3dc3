"""Smoke runs of the hot-path benchmarks' --quick modes and of the c1 path probe: they run end to end with
sane numbers.

Not performance tests: the bounds only catch a broken benchmark (NaN, zero, a missing path).
"""

from __future__ import annotations

import itertools
import math

import pytest

from bench import _path_stamps, bench_dispatcher_cpu, bench_longcalls, probe_c1_path

pytestmark = pytest.mark.slow


@pytest.mark.timeout(60)
def test_quick_long_calls_report_rate_memory_and_cpu() -> None:
    summary = bench_longcalls.main(["--quick"])
    assert summary["direct_rate"] > 0 and summary["queued_rate"] > 0
    assert summary["rss"] > 10 and summary["cpu_ms"] > 0
    assert math.isfinite(summary["added_p99"])


@pytest.mark.timeout(60)
def test_quick_dispatcher_cpu_compares_a_variant_with_this_checkout() -> None:
    summary = bench_dispatcher_cpu.main(["--quick", "--before-loop", "asyncio"])
    for level in bench_dispatcher_cpu.LEVELS:
        assert summary[f"{level}:after (this checkout)"]["cpu_ms"] > 0
        assert summary[f"{level}:before (HEAD, asyncio)"]["x_direct"] > 0
    # Each bare hop's worker ran: its CPU per hop was read, to the nanosecond, above nothing.
    for bare in ("1:bare", "1:bare_as_dispatcher"):
        assert 0 < summary[bare]["worker_ms"] < 50 and summary[bare]["p50"] > 0


@pytest.mark.timeout(90)
def test_quick_c1_path_probe_places_every_event_after_its_cause() -> None:
    summary = probe_c1_path.main(["--quick"])
    at = {event: summary[f"at:{event}"] for event, _ in _path_stamps.EVENTS if f"at:{event}" in summary}
    assert at["start"] == 0
    # What causes what, not one order: the next call's wake-up races FINISH's answer, so it only
    # follows FINISH being sent (FINISH carries the reply the caller waits for before its next push).
    # With claim tickets the next call's request arrives claimed: no round and no claim in between.
    call = ("start", "execute", "http_sent", "http_answer", "answered", "finish_sent", "finish_done", "span")
    next_call = ("finish_sent", "token")
    for chain in (call, next_call):
        assert all(at[a] < at[b] for a, b in itertools.pairwise(chain)), at
    assert not {"round", "claim_sent", "claim_done"} & at.keys(), at
    assert summary["typical_share"] > 0.5
    assert 0 < summary["direct:http"] < summary["direct:e2e"] < summary["queued:e2e"]
    assert summary["direct_gapped:http"] > 0 and summary["gap_ms"] > 0
