"""What-if speed (issue 25): an hour of demo-like traffic replayed under two configurations.

The issue's figure: an hour of demo traffic (~40,000 requests) replays in <= 2 s in the web process.
This measures what the admin panel runs after reading history: the workload (service fit and
turnaround) and both replays, in a process of its own, as CPU seconds (``time.process_time``) and
wall, with the peak memory the What-if allocates (``tracemalloc``, a separate run: tracing slows it).

``--before REF`` runs the same measurement on git revision ``REF`` (exported with ``git archive``) in
the same session, interleaved run by run, and prints the same-run ratio: on a shared machine only
that ratio means anything. The traffic is synthetic and seeded (Poisson arrivals at the demo's
rates, the demo's pools): both trees replay the very same trace.

Run: ``python bench/bench_whatif_speed.py --runs 5 --before main``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import exported, machine

ROOT = Path(__file__).resolve().parent.parent

# Runs inside the tree under test (its own runtime package), prints one JSON line.
_MEASURE = """
import json, random, sys, time, tracemalloc
from runtime.whatif.changes import apply_changes
from runtime.whatif.compare import what_if
from runtime.whatif.trace import Arrival, Trace
from runtime.wire.backendconfig import BackendConfig
from runtime.wire.groupconfig import GroupConfig, PoolConfig

rng = random.Random(1)
arrivals = []
for pool, rate, mean_s in (("interactive", 4.0, 0.7), ("document-extract", 3.0, 0.9), ("backfill", 4.2, 0.7)):
    t = 0.0
    while t < 3600:
        t += rng.expovariate(rate)
        arrivals.append(Arrival(t, pool, rng.choice((1, 2, 4)), rng.uniform(0.5, 1.5) * mean_s, 0.0))
pools = (
    PoolConfig("interactive", quantum=4, min_concurrent=4, max_concurrent=12, max_burst_per_visit=4),
    PoolConfig("document-extract", quantum=2, max_concurrent=8, max_burst_per_visit=2),
    PoolConfig("backfill", quantum=1, max_concurrent=8, max_queued=200),
    PoolConfig("default"),
)
backend = BackendConfig("sim", "http://127.0.0.1:8100/v1", max_in_flight=64)
current = GroupConfig("demo", total_concurrency=16, pools=pools, backend_id="sim", backends=(backend,))
proposed = apply_changes(current, ["backfill.weight=4"])
trace = Trace.build(arrivals)
if sys.argv[1] == "memory":
    tracemalloc.start()
    what_if(trace, current, proposed)
    print(json.dumps({"peak_mb": tracemalloc.get_traced_memory()[1] / 1e6}))
else:
    wall, cpu = time.perf_counter(), time.process_time()
    result = what_if(trace, current, proposed)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    decisions = result.current.decisions + result.proposed.decisions
    print(json.dumps({"cpu_s": cpu, "wall_s": wall, "requests": len(trace), "decisions": decisions}))
"""


def measure(tree: Path, what: str = "time") -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, what], cwd=tree, env=env, check=True, capture_output=True, text=True
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def load() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--before", help="a git revision to measure in the same session")
    args = parser.parse_args()
    print(machine())
    with exported(args.before) if args.before else contextlib.nullcontext() as before_tree:
        trees = {"after (this checkout)": ROOT}
        if before_tree is not None:
            trees = {f"before ({args.before})": before_tree, **trees}
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for run in range(args.runs):
            for name, tree in trees.items():
                samples[name].append(measure(tree))
            print(f"run {run + 1}: load {load()}", flush=True)
        medians = {}
        for name, tree in trees.items():
            cpu = [s["cpu_s"] for s in samples[name]]
            wall = [s["wall_s"] for s in samples[name]]
            medians[name] = statistics.median(cpu)
            first = samples[name][0]
            peak = measure(tree, "memory")["peak_mb"]
            print(
                f"{name}: {int(first['requests'])} requests, {int(first['decisions'])} scheduler calls; "
                f"CPU median {medians[name]:.2f} s {[round(c, 2) for c in cpu]}, "
                f"wall median {statistics.median(wall):.2f} s; peak memory {peak:.1f} MB"
            )
        if before_tree is not None:
            before, after = medians.values()
            print(f"after / before (CPU, medians) = {after / before:.2f}")


if __name__ == "__main__":
    main()
