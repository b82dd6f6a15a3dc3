"""Smoke runs of the issue-13 benchmarks' --quick modes: they run end to end with sane numbers.

Not performance tests: the bounds only catch a broken benchmark (NaN, zero, a missing path).
"""

from __future__ import annotations

import math

import pytest

from bench import bench_dispatcher_cpu, bench_longcalls

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
