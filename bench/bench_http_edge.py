"""CPU of one whole backend call in the calling process (the HTTP edge alone): this checkout against
``--before REF``, each in its own process, interleaved, against one zero-latency simulator.

Run: ``python bench/bench_http_edge.py [--runs N] [--calls N] [--before REF]``.

Why: the dispatcher's CPU per call (``bench_dispatcher_cpu.py``) also holds Valkey, scheduling and
spans, so on a busy machine a change to the HTTP edge alone drowns in its noise; this measures
``OpenAIBackend.complete`` (adapter, client, lean pool) and nothing else, at concurrency 16.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, median, simulator_proc
from bench.bench_dispatcher_cpu import exported

CONCURRENCY = 16
# Run in a child process importing the project from the measured checkout (PYTHONPATH).
CHILD = """
import asyncio, sys, time
from runtime.backends.adapter import OpenAIBackend
from runtime.eventloop import run

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
url, total, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


async def calls() -> float:
    backend = OpenAIBackend(url, max_connections=concurrency)

    async def worker(n: int) -> None:
        for _ in range(n):
            await backend.complete(BODY)

    try:
        await asyncio.gather(*(worker(50) for _ in range(concurrency)))  # warm-up: connections open
        started = time.process_time()
        await asyncio.gather(*(worker(total // concurrency) for _ in range(concurrency)))
        return (time.process_time() - started) / total * 1e6
    finally:
        await backend.aclose()


print(f"{run(calls()):.1f}")
"""


def one(root: Path, url: str, total: int) -> float:
    """Microseconds of the child's CPU per call, the project imported from ``root``."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, url, str(total), str(CONCURRENCY)],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--before", default="main")
    args = parser.parse_args()
    results: dict[str, list[float]] = {"before": [], "after": []}
    with simulator_proc() as url, exported(args.before) as before:
        for i in range(args.runs):
            order = [("before", before), ("after", ROOT)]
            for name, root in order if i % 2 else order[::-1]:
                results[name].append(one(root, url, args.calls))
    print(f"# HTTP edge CPU per whole call, c={CONCURRENCY}, {args.calls} calls, median of {args.runs} runs")
    for name, label in (("before", f"before ({args.before})"), ("after", "after (this checkout)")):
        print(f"{label}: {median(results[name]):.1f} µs/call  {results[name]}")
    print(f"after / before = {median(results['after']) / median(results['before']):.3f}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
