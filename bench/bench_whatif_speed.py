"""What-if speed (issue 25): an hour of demo-like traffic replayed under two configurations.

The issue's figure: an hour of demo traffic (~40,000 requests) replays in <= 2 s in the web process.
Two stages, each in a process of its own per run, as CPU seconds (``time.process_time``: every thread
of the process, chDB's too) and wall, with the peak memory Python allocates (``tracemalloc``, a
separate run: tracing slows it):

* ``replay``: the pure replay after reading history (the workload's service fit and turnaround, and
  both replays) on the synthetic trace;
* ``e2e``: what an operator waits for. The same hour written as the dispatcher's spans into a real
  chDB history (the ingester's row shape and insert), then the read (``history.whatif.whatif_trace``)
  and ``what_if``: read, replay and total. (``pools.whatif.group_whatif`` adds two small ORM reads.)

``--before REF`` runs the same measurements on git revision ``REF`` (exported with ``git archive``) in
the same session, interleaved run by run, and prints the same-run ratio: on a shared machine only
that ratio means anything. The traffic is synthetic and seeded (Poisson arrivals at the demo's
rates, the demo's pools: ``bench/_whatif_demo.py``): both trees replay the very same trace.

Run: ``python bench/bench_whatif_speed.py --runs 5 --before main`` (``--stage replay|e2e`` for one).
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

from bench._common import exported, machine, scratch

ROOT = Path(__file__).resolve().parent.parent

# Runs inside the tree under test (its own runtime and history packages; the demo traffic from this
# checkout's bench/_whatif_demo.py), prints one JSON line. argv: stage (replay | e2e | seed), what
# (time | memory), and for e2e and seed the chDB directory.
_MEASURE = """
import json, sys, time, tracemalloc
sys.path.append(sys.argv[4])  # this checkout's bench/, after the tree under test
from _whatif_demo import GROUP, HOUR_S, demo_arrivals, demo_configs
from runtime.whatif.compare import what_if
from runtime.whatif.trace import Trace

stage, what = sys.argv[1], sys.argv[2]
current, proposed = demo_configs()
if stage == "replay":
    trace = Trace.build(demo_arrivals())
    if what == "memory":
        tracemalloc.start()
        what_if(trace, current, proposed)
        print(json.dumps({"peak_mb": tracemalloc.get_traced_memory()[1] / 1e6}))
    else:
        wall, cpu = time.perf_counter(), time.process_time()
        result = what_if(trace, current, proposed)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        decisions = result.current.decisions + result.proposed.decisions
        print(json.dumps({"cpu_s": cpu, "wall_s": wall, "requests": len(trace), "decisions": decisions}))
    sys.exit()

import resource
from datetime import UTC, datetime
from history import schema
from history.client import client_for
from history.whatif import whatif_trace

client = client_for("chdb://" + sys.argv[3] + "/clickhouse")
until_s = float(open(sys.argv[3] + "/until").read()) if stage != "seed" else float(int(time.time()))
since, until = (datetime.fromtimestamp(t, tz=UTC) for t in (until_s - HOUR_S - 5, until_s))
if stage == "seed":  # the hour as the dispatcher's spans, through the ingester's row shape and insert
    sys.path.insert(0, ".")
    from history.ingester import span_row
    from runtime.telemetry import semconv
    from tests.support.history_spans import execution_doc

    schema.migrate(client, retention_days=30)
    base_ns = int((until_s - HOUR_S - 3) * 1e9)
    rows = []
    for a in demo_arrivals():
        doc = execution_doc(pool=a.pool_id, group=GROUP, queue_wait=0.0, execution=a.execution_s,
                            start_ns=base_ns + int(a.enqueued_at * 1e9))
        doc["attributes"][semconv.COST_UNITS] = a.cost
        rows.append(span_row(doc))
    for k in range(0, len(rows), 10_000):
        client.insert(schema.TABLE, rows[k:k + 10_000], schema.INSERT_COLUMNS)
    client.command(f"OPTIMIZE TABLE {schema.table_name(client)} FINAL")  # merged, as hours after a load
    open(sys.argv[3] + "/until", "w").write(repr(until_s))
    print(json.dumps({"rows": len(rows)}))
    sys.exit()

pool_ids = [p.pool_id for p in current.pools]
client.query("SELECT 1")  # the web process's engine is up before an operator asks
if what == "memory":
    tracemalloc.start()
clock = (time.perf_counter(), time.process_time())
trace = whatif_trace(client=client, group=GROUP, pool_ids=pool_ids, since=since, until=until)
read = (time.perf_counter(), time.process_time())
result = what_if(trace, current, proposed)
done = (time.perf_counter(), time.process_time())
if what == "memory":
    print(json.dumps({"peak_mb": tracemalloc.get_traced_memory()[1] / 1e6,
                      "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
else:
    print(json.dumps({
        "requests": len(trace),
        "read_wall_s": read[0] - clock[0], "read_cpu_s": read[1] - clock[1],
        "replay_wall_s": done[0] - read[0], "replay_cpu_s": done[1] - read[1],
        "wall_s": done[0] - clock[0], "cpu_s": done[1] - clock[1],
    }))
"""


def measure(tree: Path, stage: str, what: str = "time", data: Path | None = None) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, "-c", _MEASURE, stage, what, str(data or ""), str(ROOT / "bench")]
    done = subprocess.run(argv, cwd=tree, env=env, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def load() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s {[round(v, 2) for v in values]}"


def replay_stage(trees: dict[str, Path], runs: int) -> None:
    """The pure replay (workload + both replays) on the synthetic trace, tree after tree, run by run."""
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for run in range(runs):
        for name, tree in trees.items():
            samples[name].append(measure(tree, "replay"))
        print(f"replay run {run + 1}: load {load()}", flush=True)
    medians = {}
    for name, tree in trees.items():
        cpu = [s["cpu_s"] for s in samples[name]]
        medians[name] = statistics.median(cpu)
        first = samples[name][0]
        peak = measure(tree, "replay", "memory")["peak_mb"]
        print(
            f"replay, {name}: {int(first['requests'])} requests, {int(first['decisions'])} scheduler calls; "
            f"CPU median {_summary(cpu)}, wall median {_summary([s['wall_s'] for s in samples[name]])}; "
            f"peak memory {peak:.1f} MB"
        )
    if len(trees) == 2:
        before, after = medians.values()
        print(f"replay: after / before (CPU, medians) = {after / before:.2f}")


def end_to_end_stage(trees: dict[str, Path], runs: int) -> None:
    """The hour written as spans into a real chDB history, then what the What-if runs: the read
    (``history.whatif.whatif_trace``) and ``what_if``, in a fresh process per run."""
    with scratch() as data:
        seeded = measure(ROOT, "seed", data=data)
        print(f"end to end: {seeded['rows']} spans in a chDB history; load {load()}", flush=True)
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for run in range(runs):
            for name, tree in trees.items():
                samples[name].append(measure(tree, "e2e", data=data))
            print(f"end-to-end run {run + 1}: load {load()}", flush=True)
        medians = {}
        for name, tree in trees.items():
            got = samples[name]
            medians[name] = statistics.median(s["cpu_s"] for s in got)
            memory = measure(tree, "e2e", "memory", data=data)
            print(f"end to end, {name}: {int(got[0]['requests'])} requests read")
            for part in ("read", "replay", ""):
                key = f"{part}_" if part else ""
                print(
                    f"  {part or 'total'}: CPU median {_summary([s[key + 'cpu_s'] for s in got])}, "
                    f"wall median {_summary([s[key + 'wall_s'] for s in got])}"
                )
            print(
                f"  peak memory allocated by Python {memory['peak_mb']:.1f} MB "
                f"(process max RSS {memory['max_rss_mb']:.0f} MB, chDB's engine included)"
            )
        if len(trees) == 2:
            before, after = medians.values()
            print(f"end to end: after / before (total CPU, medians) = {after / before:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--before", help="a git revision to measure in the same session")
    parser.add_argument("--stage", choices=("replay", "e2e", "both"), default="both")
    args = parser.parse_args()
    print(machine())
    with exported(args.before) if args.before else contextlib.nullcontext() as before_tree:
        trees = {"after (this checkout)": ROOT}
        if before_tree is not None:
            trees = {f"before ({args.before})": before_tree, **trees}
        if args.stage in ("replay", "both"):
            replay_stage(trees, args.runs)
        if args.stage in ("e2e", "both"):
            end_to_end_stage(trees, args.runs)


if __name__ == "__main__":
    main()
