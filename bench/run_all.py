"""Smoke run of every benchmark (``--quick``), one after the other; about a minute in all.

Run: ``python bench/run_all.py`` (quick) or ``python bench/run_all.py --full`` (each benchmark's full
run, ~10 minutes on 2 cores). Returns each benchmark's summary so a test can check the numbers.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import bench_fairness, bench_isolation, bench_overhead, bench_scale, bench_throughput

BENCHMARKS = {
    "overhead": bench_overhead,
    "throughput": bench_throughput,
    "fairness": bench_fairness,
    "isolation": bench_isolation,
    "scale": bench_scale,
}


def run_all(full: bool = False) -> dict[str, Any]:
    summaries: dict[str, Any] = {}
    for name, module in BENCHMARKS.items():
        started = time.perf_counter()
        summaries[name] = module.main([] if full else ["--quick"])
        print(f"({name}: {time.perf_counter() - started:.1f} s)\n", flush=True)
    return summaries


if __name__ == "__main__":
    run_all(full="--full" in sys.argv[1:])
