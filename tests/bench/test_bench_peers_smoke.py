"""Smoke run of bench_peers.py --quick: the three paths run end to end and give sane numbers.

Not a performance test. LiteLLM takes part only where a full run already installed it under var/.
"""

from __future__ import annotations

import math

import pytest

from bench import bench_peers

pytestmark = pytest.mark.slow


@pytest.mark.timeout(90)
def test_quick_peer_comparison_produces_sane_numbers() -> None:
    summary = bench_peers.main(["--quick"])
    for level in bench_peers.LEVELS:
        assert summary[f"{level}:direct"]["rate"] > 0
        queued = summary[f"{level}:queued"]
        assert queued["rate"] > 0 and queued["cpu_ms"] > 0 and math.isfinite(queued["added_p99"])
        if bench_peers.litellm_binary(install=False)[0] is not None:
            assert summary[f"{level}:litellm"]["cpu_ms"] > 0
