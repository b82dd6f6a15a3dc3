"""Producer CPU per submitted call on the queued path: this checkout against a "before" revision.

Run: ``python bench/bench_producer_cpu.py [--quick] [--runs N] [--before REF]``.

In the throughput benchmarks the producer shares the machine's cores with the dispatcher, Valkey and
the simulator, so its CPU per call bounds "queued x direct" as much as the dispatcher's does. Each
variant's producer runs as its own process (``bench/_producer_proc.py``, importing that variant's tree)
against one private Valkey, one zero-latency simulator and one dispatcher of this checkout, one
variant at a time in a rotating order; each reports its own CPU per measured call (``time.process_time``)
with the no-op tracer and with the OpenTelemetry SDK exporting its spans to Valkey.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    ROOT,
    client,
    dispatcher_procs,
    group,
    machine,
    median,
    new_keys,
    private_valkey,
    publish,
    simulator_proc,
    spawn,
    stop_proc,
    table,
)
from bench.bench_dispatcher_cpu import exported
from runtime.wire.groupconfig import PoolConfig

LEVEL = 16
SLOTS = 64


def one_load(root: Path, valkey_url: str, prefix: str, calls: int, tracing: bool) -> dict[str, float]:
    # Run by path: the "before" tree may predate this script, and imports ``runtime`` from its root.
    script = str(ROOT / "bench" / "_producer_proc.py")
    proc = spawn([script, valkey_url, prefix, str(LEVEL), str(calls), "1" if tracing else "0"], root=root)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        proc.wait(60)
    finally:
        stop_proc(proc)
    if not line.startswith("{"):
        raise RuntimeError(f"producer process failed: {line!r}")
    sample: dict[str, float] = orjson.loads(line)
    return sample


async def measure(variants: dict[str, Path], quick: bool, runs: int) -> dict[tuple[str, bool], list[dict]]:
    calls = 1000 if quick else 4000
    results: dict[tuple[str, bool], list[dict]] = {}
    with private_valkey() as valkey_url, simulator_proc() as sim_url:
        keys = new_keys()
        config = group(sim_url, [PoolConfig("default", max_concurrent=SLOTS)], policy="fifo", total=SLOTS)
        async with client(valkey_url) as conn:
            await publish(conn, keys, config)
        with dispatcher_procs(valkey_url, keys.prefix, config.group_id, 1, SLOTS):
            names = list(variants)
            for run in range(runs):
                shift = run % len(names)
                for tracing in (False, True):
                    for name in names[shift:] + names[:shift]:
                        sample = one_load(variants[name], valkey_url, keys.prefix, calls, tracing)
                        results.setdefault((name, tracing), []).append(sample)
    return results


def report(results: dict[tuple[str, bool], list[dict]], variants: list[str], runs: int, quick: bool) -> None:
    print(f"# producer CPU per call, concurrency {LEVEL}, median of {runs} runs{' (quick)' if quick else ''}")
    print(f"# {machine()}")
    rows = []
    for tracing in (False, True):
        for name in variants:
            samples = results[(name, tracing)]
            rows.append(
                [
                    "SDK -> Valkey stream" if tracing else "no-op",
                    name,
                    f"{median([s['cpu_ms'] for s in samples]):.3f}",
                    f"{median([s['rate'] for s in samples]):.0f}",
                ]
            )
    print(table(["tracing", "producer", "producer CPU ms/call", "completions/s"], rows))


def main(argv: list[str] | None = None) -> None:
    import asyncio

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--before", help="git revision to compare against (exported with git archive)")
    args = parser.parse_args(argv)
    runs = args.runs or (1 if args.quick else 3)
    with contextlib.ExitStack() as stack:
        variants: dict[str, Path] = {}
        if args.before:
            variants[f"before ({args.before})"] = stack.enter_context(exported(args.before))
        variants["after (this checkout)"] = ROOT
        results = asyncio.run(measure(variants, args.quick, runs))
    report(results, list(variants), runs, args.quick)


if __name__ == "__main__":
    main()
