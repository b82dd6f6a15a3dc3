"""The simulator's own speed: this checkout's simulator against an older one, same direct client.

Run: ``python bench/bench_simulator.py [--quick] [--runs N] [--old-ref REF]``.

Both simulators run as processes with latency 0; the old one is exported from git (``--old-ref``,
default the last commit with the hand-written HTTP/1.1 server) into a scratch directory and started
with ``python -m simulator.server``. The load is the direct path of the other benchmarks
(``Producer(direct_backend=OpenAIBackend)`` in closed loop) at concurrency 16 and 64; runs are
interleaved and the table shows medians and the new/old ratios. It answers one question: would the
simulator become the bottleneck of bench/ (the direct baseline is what the queued path is compared to)?
Besides calls/s it reports the simulator process's CPU time per call (from /proc): one core divided
by it is the most calls/s that simulator could ever serve, whatever the client.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    ROOT,
    closed_loop,
    cpu_seconds,
    machine,
    median,
    pct,
    scratch,
    simulator_process,
    table,
)
from runtime.backends.adapter import OpenAIBackend
from runtime.producer import Producer

OLD_REF = "64c1b6c"  # simulator/http11.py, before the aiohttp server
CONCURRENCIES = (16, 64)


Sample = tuple[float, float, float]
"""(completions/s, p50 latency ms, simulator CPU ms per call) of one run."""


async def direct(sim_url: str, sim_pid: int, concurrency: int, total: int) -> Sample:
    backend = OpenAIBackend(sim_url, max_connections=concurrency)
    try:
        async with Producer(None, direct_backend=backend) as producer:  # type: ignore[arg-type]
            await closed_loop(producer, "default", concurrency, total // 10)  # warm the connections
            cpu_before = cpu_seconds(sim_pid)
            latencies, wall = await closed_loop(producer, "default", concurrency, total)
            cpu = cpu_seconds(sim_pid) - cpu_before
    finally:
        await backend.aclose()
    return total / wall, pct(latencies, 0.5) * 1000, cpu * 1000 / total


def export(ref: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "simulator"], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def measure(old_ref: str, quick: bool, runs: int) -> dict[str, list[Sample]]:
    total = 600 if quick else 4000
    results: dict[str, list[Sample]] = {}
    with (
        scratch() as old_root,
        simulator_process(root=export(old_ref, old_root), module="simulator.server") as (old_url, old_proc),
        simulator_process() as (new_url, new_proc),
    ):
        for _ in range(runs):
            for concurrency in CONCURRENCIES:
                for name, url, pid in (("old", old_url, old_proc.pid), ("new", new_url, new_proc.pid)):
                    key = f"{name} c={concurrency}"
                    results.setdefault(key, []).append(asyncio.run(direct(url, pid, concurrency, total)))
    return results


def report(results: dict[str, list[Sample]], runs: int, quick: bool, old_ref: str) -> None:
    print(
        f"# simulator: aiohttp (this checkout) vs {old_ref} (http11), latency 0, direct client, "
        f"median of {runs}"
    )
    print(f"# {machine()}{' (quick)' if quick else ''}")
    rows = []
    for concurrency in CONCURRENCIES:
        old, new = results[f"old c={concurrency}"], results[f"new c={concurrency}"]
        old_rate, new_rate = median([s[0] for s in old]), median([s[0] for s in new])
        old_cpu, new_cpu = median([s[2] for s in old]), median([s[2] for s in new])
        rows.append(
            [
                concurrency,
                f"{old_rate:.0f} / {new_rate:.0f}",
                f"{new_rate / old_rate:.2f}",
                f"{median([s[1] for s in old]):.2f} / {median([s[1] for s in new]):.2f}",
                f"{old_cpu:.3f} / {new_cpu:.3f}",
                f"{new_cpu / old_cpu:.2f}",
                f"{1000 / new_cpu:.0f}",
            ]
        )
    headers = ["concurrency", "calls/s old/new", "new/old", "p50 ms old/new", "sim CPU ms/call old/new"]
    print(table([*headers, "CPU new/old", "new sim ceiling calls/s"], rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--old-ref", default=OLD_REF, help="git ref of the simulator to compare against")
    args = parser.parse_args(argv)
    runs = args.runs or (1 if args.quick else 5)
    report(measure(args.old_ref, args.quick, runs), runs, args.quick, args.old_ref)


if __name__ == "__main__":
    main()
