"""History schema migration on embedded chDB: this checkout against a "before" revision.

Run: ``python bench/bench_migrate.py [--runs N] [--before REF]``.

Every process that owns an embedded history (``runhistory``, a web process with ``chdb://``) and every
test's fresh database migrates before its first read, so this cost is paid at each start-up. Each
sample is a fresh process of its variant's tree that opens a new chDB database, then migrates it twice
(fresh, then already up to date); it reports its own CPU (all threads: ``RUSAGE_SELF``) and wall time
per step. Variants run one at a time in a rotating order. CPU is the load-robust figure.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, exported, machine, median, scratch, table

# Run in the variant's tree (its own ``history`` package), so it may predate this script.
PROBE = """
import resource, sys, time, orjson
from history import schema
from history.client import client_for
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
out = {}
client = client_for("chdb://" + sys.argv[1])
for step, run in (
    ("open", lambda: client.command("SELECT 1")),
    ("fresh", lambda: schema.migrate(client, retention_days=30)),
    ("again", lambda: schema.migrate(client, retention_days=30)),
):
    c, w = cpu(), time.monotonic()
    run()
    out[step] = {"cpu": cpu() - c, "wall": time.monotonic() - w}
print(orjson.dumps(out).decode())
"""
STEPS = ("open", "fresh", "again")


def one_sample(tree: Path) -> dict[str, dict[str, float]]:
    with scratch() as data:
        done = subprocess.run(
            [sys.executable, "-c", PROBE, str(data / "ch")],
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=300,
        )
    if done.returncode != 0:
        raise RuntimeError(f"migration probe failed in {tree}: {done.stderr[-2000:]}")
    sample: dict[str, dict[str, float]] = orjson.loads(done.stdout.strip().splitlines()[-1])
    return sample


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before", help="git revision to compare against (exported with git archive)")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        variants: dict[str, Path] = {}
        if args.before:
            variants[f"before ({args.before})"] = stack.enter_context(exported(args.before))
        variants["after (this checkout)"] = ROOT
        names = list(variants)
        samples: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in names}
        for run in range(args.runs):
            shift = run % len(names)
            for name in names[shift:] + names[:shift]:
                samples[name].append(one_sample(variants[name]))
    print(f"# history migrate on a fresh embedded chDB, median of {args.runs} runs")
    print(f"# {machine()}")
    rows = []
    for step in STEPS:
        for name in names:
            rows.append(
                [
                    step,
                    name,
                    f"{median([s[step]['cpu'] for s in samples[name]]):.3f}",
                    f"{median([s[step]['wall'] for s in samples[name]]):.2f}",
                ]
            )
    print(table(["step", "variant", "CPU s", "wall s"], rows))


if __name__ == "__main__":
    main()
