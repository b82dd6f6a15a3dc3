"""Smoke run of the benchmarks' quick mode: they run end to end and produce sane numbers.

Not a performance test: the bounds only catch a broken benchmark (NaN, zero, inverted baselines).
"""

from __future__ import annotations

import math

import pytest

from bench.run_all import run_all

pytestmark = pytest.mark.slow


@pytest.mark.timeout(150)
def test_quick_benchmarks_produce_sane_numbers() -> None:
    s = run_all(full=False)
    for row in s["overhead"]:
        assert math.isfinite(row["added_p50_ms"]) and math.isfinite(row["added_p99_ms"])
    assert s["throughput"]["direct"] > 0 and s["throughput"]["1 dispatcher"] > 0
    for row in s["fairness"]:
        assert row["error_pp"] < 5.0 and row["jain"] > 0.99
    iso = s["isolation"]
    assert iso["FIFO + flood"] > iso["DRR + flood"] > 0
    assert 0 < s["scale"]["decision_us_1000"] < 1000
    assert s["scale"]["drain_rate"] > 0
