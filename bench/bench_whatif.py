"""What-if against reality (issue 25): predicted queue waits checked against real runs of the demo.

1. Runs the demo (``manage.py demo``: simulator, web + history, one dispatcher, load generator) for
   ``--minutes`` in a scratch data directory, optionally after ``--setup`` changes to the demo group.
2. ``manage.py whatif --json`` over that window: the replay under the configuration that was in force
   against what history recorded (target: per-pool p50 and p99 within 20 %), and the prediction for
   ``--change`` (default ``backfill.weight=4``), made before the change.
3. Saves the change, runs the demo again under the same load (the load generator's lanes are seeded),
   and compares the prediction with the new measured waits (target: within 25 %).
4. Speed: an hour of demo-like traffic (~40,000 requests, synthetic) through both replays in this
   process, with the peak memory the replay allocates (``tracemalloc``); for a same-run ratio against
   another revision, ``bench/bench_whatif_speed.py --before main``.

Waits below ``--floor-ms`` (default 50 ms) are compared in absolute terms instead (both below it
counts as a match): a few milliseconds of dispatcher latency are not a queue.

Run: ``python bench/bench_whatif.py --minutes 3`` (about 8 minutes: two runs plus start-up).
``--keep DIR`` keeps the recording (history and the database of each run); ``--from DIR`` replays a
kept recording again without running the demo, so that a change to the model is checked on the same
traffic.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine, scratch, table
from bench._whatif_demo import demo_arrivals, demo_configs
from runtime.valkey import embedded
from runtime.whatif.compare import what_if
from runtime.whatif.trace import Trace

ROOT = Path(__file__).resolve().parent.parent
POOLS = ("interactive", "document-extract", "backfill")
LEVELS = ("p50", "p99")
RUN1_DB = "db-run1.sqlite3"  # the database as run 1 had it (the change is saved before run 2)
WINDOWS = "windows.json"

_SAVE = """
import sys
import django
django.setup()
from pools import services
from pools.models import FabricGroup, Pool
from runtime.whatif.changes import parse_assignment
for text in sys.argv[1:]:
    target, field, value = parse_assignment(text)
    field = {"weight": "quantum", "burst": "max_burst_per_visit"}.get(field, field)
    if target == "group":
        group = FabricGroup.objects.get(group_id="demo")
        setattr(group, field, type(getattr(group, field))(value))
        services.group_save(group=group, publish=False)
    else:
        pool = Pool.objects.get(pool_id=target)
        setattr(pool, field, int(value))
        services.pool_save(pool=pool, publish=False)
"""


@contextlib.contextmanager
def stopped_valkey(data_dir: Path) -> Iterator[None]:
    """Stops the embedded Valkey the first command that needed one started under ``data_dir``."""
    try:
        yield
    finally:
        embedded.stop(data_dir)


def manage(env: dict[str, str], *args: str, capture: bool = False) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True, text=True,
        capture_output=capture,
    )  # fmt: skip
    return done.stdout if capture else ""


def save(env: dict[str, str], changes: list[str]) -> None:
    """Writes changes to the demo group in the database (the next demo start publishes them)."""
    if changes:
        subprocess.run([sys.executable, "-c", _SAVE, *changes], cwd=ROOT, env=env, check=True)


def run_demo(env: dict[str, str], seconds: float, log: Path) -> list[float]:
    """One demo run; returns the wall-clock window its load covered."""
    port, sim_port = embedded.free_port(), embedded.free_port()
    start = time.time()
    with open(log, "w") as out:
        subprocess.run(
            [sys.executable, "manage.py", "demo", "--duration", str(seconds), "--port", str(port),
             "--sim-port", str(sim_port), "--admin-password", "bench-pw"],
            cwd=ROOT, env=env, check=True, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return [start, time.time()]


def whatif(env: dict[str, str], until: float, minutes: float, changes: list[str]) -> dict[str, Any]:
    args = ["whatif", "--group", "demo", "--until", f"{until:.3f}", "--minutes", f"{minutes:.3f}", "--json"]
    for change in changes:
        args += ["--set", change]
    return json.loads(manage(env, *args, capture=True))


def close(predicted: float | None, measured: float | None, floor_s: float) -> tuple[str, bool]:
    """The error of a prediction, and whether it is within tolerance (the caller's bound)."""
    if predicted is None or measured is None:
        return "n/a", False
    if predicted < floor_s and measured < floor_s:
        return "both < floor", True
    return f"{(predicted - measured) / measured * 100:+.0f}%", False


def compare(
    title: str, predicted: dict[str, Any], measured: dict[str, Any], bound: float, floor_s: float
) -> tuple[str, bool]:
    rows, ok_all = [], True
    for pool in POOLS:
        for level in LEVELS:
            p = predicted["pools"][pool][predicted["side"]]["wait"][level]
            m = measured["pools"][pool]["recorded"]["wait"][level]
            text, small = close(p, m, floor_s)
            ok = small or (p is not None and m is not None and abs(p - m) <= bound * m)
            ok_all &= ok
            rows.append([pool, level, _ms(m), _ms(p), text, "yes" if ok else "NO"])
    headers = ["pool", "wait", "measured", "predicted", "error", f"within {bound * 100:.0f}%"]
    return f"{title}\n\n{table(headers, rows)}", ok_all


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.0f} ms"


def speed() -> str:
    """Both replays of an hour of demo-like traffic (Poisson arrivals at the demo's rates)."""
    current, proposed = demo_configs()
    trace = Trace.build(demo_arrivals())
    started, cpu = time.perf_counter(), time.process_time()
    result = what_if(trace, current, proposed)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    tracemalloc.start()  # a second run for memory: tracing slows Python several times
    what_if(trace, current, proposed)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return (
        f"Speed: {len(trace)} requests (1 h at the demo's rates), workload + both replays in {elapsed:.2f} s "
        f"wall, {cpu:.2f} s CPU ({result.current.decisions + result.proposed.decisions} scheduler calls, "
        f"{len(result.current.launch_order)} launches per replay), "
        f"peak memory allocated {peak / 1e6:.1f} MB"
    )


def record(data: Path, setup: list[str], changes: list[str], minutes: float) -> dict[str, Any]:
    """Runs the demo twice in ``data`` (before and after ``changes``); returns and saves the windows.

    Everything the analysis reads stays in ``data`` (history, and the database as each run had it), so
    the replays can be made again on the same recordings with ``--from``.
    """
    env = demo_env(data, "db.sqlite3")
    manage(env, "migrate", "-v", "0")
    manage(env, "seed_demo", "--reset", "-v", "0")
    save(env, setup)
    seconds = minutes * 60
    run1 = run_demo(env, seconds, data / "run1.log")
    shutil.copyfile(data / "db.sqlite3", data / RUN1_DB)
    save(env, changes)
    run2 = run_demo(env, seconds, data / "run2.log")
    windows = {"setup": setup, "changes": changes, "minutes": minutes, "run1": run1, "run2": run2}
    (data / WINDOWS).write_text(json.dumps(windows, indent=2))
    return windows


def demo_env(data: Path, database: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DISPATCH_DATA_DIR": str(data),
        "DJANGO_SETTINGS_MODULE": "dispatch_project.settings",
        "DATABASE_URL": f"sqlite:///{data / database}",
    }
    env.pop("VALKEY_URL", None)
    return env


def analyse(data: Path, windows: dict[str, Any], floor_s: float) -> None:
    """The three checks over the recorded runs (see the module docstring)."""
    changes = windows["changes"]
    (start1, end1), (start2, end2) = windows["run1"], windows["run2"]
    before = whatif(demo_env(data, RUN1_DB), end1, (end1 - start1) / 60, changes)
    after = whatif(demo_env(data, "db.sqlite3"), end2, (end2 - start2) / 60, [])
    setup = windows["setup"] or "demo defaults"
    print(f"\nsetup: {setup}; change: {changes}; {windows['minutes']:g} min per run")
    print(f"run 1: {before['requests']} requests; run 2: {after['requests']} requests")
    print("service model, run 1:", *before["fits"], sep="\n  ")
    text, ok1 = compare(
        "Run 1 replayed under the configuration in force vs what history recorded:",
        {**before, "side": "current"}, before, 0.20, floor_s,
    )  # fmt: skip
    print(text)
    text, ok2 = compare(
        f"Prediction for {changes} (made from run 1) vs run 2 measured:",
        {**before, "side": "proposed"}, after, 0.25, floor_s,
    )  # fmt: skip
    print(text)
    text, ok3 = compare(
        "Run 2 replayed under its own configuration vs what history recorded:",
        {**after, "side": "current"}, after, 0.20, floor_s,
    )  # fmt: skip
    print(text)
    verdict = {True: "met", False: "MISSED"}
    print(
        f"\nreproduction of run 1 (20 %): {verdict[ok1]}; prediction (25 %): {verdict[ok2]}; "
        f"reproduction of run 2 (20 %): {verdict[ok3]}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="length of each demo run")
    parser.add_argument("--setup", action="append", default=[], help="change the demo group first")
    parser.add_argument("--change", action="append", default=None, help="the change to predict and apply")
    parser.add_argument("--floor-ms", type=float, default=50.0)
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--keep", type=Path, help="record into this directory and keep it")
    parser.add_argument("--from", dest="source", type=Path, help="analyse a kept recording again, no runs")
    args = parser.parse_args()
    changes = args.change or ["backfill.weight=4"]
    floor_s = args.floor_ms / 1000
    print(machine())
    if args.source is None:
        print(speed())
    if args.speed_only:
        return
    if args.source is not None:
        with stopped_valkey(args.source):
            analyse(args.source, json.loads((args.source / WINDOWS).read_text()), floor_s)
        return
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=False)
            data = args.keep
        else:
            data = stack.enter_context(scratch())
        stack.enter_context(stopped_valkey(data))
        windows = record(data, args.setup, changes, args.minutes)
        analyse(data, windows, floor_s)


if __name__ == "__main__":
    main()
