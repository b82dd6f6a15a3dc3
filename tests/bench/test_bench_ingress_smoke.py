"""Smoke run of the ingress benchmark's quick mode: it runs end to end and produces finite figures."""

from __future__ import annotations

import math

import pytest

from bench import bench_ingress

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_quick_ingress_benchmark_produces_finite_numbers() -> None:
    summary = bench_ingress.main(["--quick"])
    assert all(math.isfinite(value) for value in summary.values())
