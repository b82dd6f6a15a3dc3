"""Dispatcher CPU per call and throughput against direct: this checkout against a "before" variant.

Run: ``python bench/bench_dispatcher_cpu.py [--quick] [--runs N] [--before REF] [--before-loop asyncio]``.

The same-run before/after figure of each hot-path change (issue 13). Variants: ``after`` (this
checkout) and ``before``: the git revision ``--before`` exported to a scratch directory, and/or this
checkout on asyncio's default loop (``--before-loop asyncio``). Each variant's dispatcher
(``bench._dispatcher_proc``, 64 slots) runs as its own process against one zero-latency simulator
and one private Valkey; this process is the producer (closed loop, same client for every path).
Every run measures ``direct`` (the baseline) and each variant at concurrency 1, 16 and 64, in a
rotating order. Dispatcher CPU per call comes from /proc/<pid>/stat around the measured calls,
Valkey's from ``INFO cpu``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    ROOT,
    client,
    closed_loop,
    cpu_seconds,
    dispatcher_procs,
    exported,
    group,
    machine,
    measured_load,
    median,
    new_keys,
    private_valkey,
    publish,
    simulator_proc,
    table,
    valkey_cpu_ms,
)
from runtime.backends.adapter import OpenAIBackend
from runtime.producer import Producer
from runtime.wire.groupconfig import PoolConfig

LEVELS = (1, 16, 64)
SLOTS = 64


def calls_at(level: int, quick: bool) -> int:
    return {1: 100, 16: 400, 64: 640}[level] if quick else {1: 400, 16: 2000, 64: 3200}[level]


async def measure(variants: dict[str, tuple[Path, dict[str, str]]], quick: bool, runs: int) -> dict:
    results: dict[tuple[int, str], list[dict[str, float]]] = {}
    with private_valkey() as valkey_url, simulator_proc() as sim_url, contextlib.ExitStack() as stack:
        backend = OpenAIBackend(sim_url, max_connections=SLOTS)
        async with client(valkey_url) as conn, contextlib.AsyncExitStack() as producers:
            paths: dict[str, tuple[Producer, Any]] = {}

            async def no_cpu() -> dict[str, float]:
                return {}

            direct = Producer(None, direct_backend=backend)  # type: ignore[arg-type]
            paths["direct"] = (await producers.enter_async_context(direct), no_cpu)
            for name, (root, env) in variants.items():
                keys = new_keys()
                config = group(
                    sim_url, [PoolConfig("default", max_concurrent=SLOTS)], policy="fifo", total=SLOTS
                )
                await publish(conn, keys, config)
                (proc,) = stack.enter_context(
                    dispatcher_procs(valkey_url, keys.prefix, config.group_id, 1, SLOTS, env=env, root=root)
                )

                async def cpu(pid: int = proc.pid) -> dict[str, float]:
                    return {"dispatcher_ms": cpu_seconds(pid) * 1000, "valkey_ms": await valkey_cpu_ms(conn)}

                paths[name] = (await producers.enter_async_context(Producer(conn, keys=keys)), cpu)
            for producer, _ in paths.values():
                await closed_loop(producer, "default", SLOTS, 4 * SLOTS)
            names = list(paths)
            for run in range(runs):
                for level in LEVELS:
                    shift = run % len(names)
                    for name in names[shift:] + names[:shift]:
                        producer, cpu_fn = paths[name]
                        sample = await measured_load(producer, level, calls_at(level, quick), cpu_fn)
                        results.setdefault((level, name), []).append(sample)
        await backend.aclose()
    return results


def report(results: dict, variants: list[str], runs: int, quick: bool) -> dict[str, dict[str, float]]:
    print(f"# dispatcher CPU per call and throughput, median of {runs} runs{' (quick)' if quick else ''}")
    print(f"# {machine()}")
    rows, summary = [], {}
    for level in LEVELS:
        direct = results[(level, "direct")]
        for name in ["direct", *variants]:
            samples = results[(level, name)]
            ratio = median([s["rate"] / d["rate"] for s, d in zip(samples, direct, strict=True)])
            added = median([s["p50"] - d["p50"] for s, d in zip(samples, direct, strict=True)])
            added99 = median([s["p99"] - d["p99"] for s, d in zip(samples, direct, strict=True)])
            cpu = median([s.get("dispatcher_ms", float("nan")) for s in samples])
            vcpu = median([s.get("valkey_ms", float("nan")) for s in samples])
            rows.append(
                [
                    level,
                    name,
                    f"{median([s['rate'] for s in samples]):.0f}",
                    f"{ratio:.2f}",
                    "-" if name == "direct" else f"{added:+.2f} / {added99:+.2f}",
                    "-" if name == "direct" else f"{cpu:.3f}",
                    "-" if name == "direct" else f"{vcpu:.3f}",
                ]
            )
            summary[f"{level}:{name}"] = {
                "x_direct": ratio,
                "added_p50": added,
                "added_p99": added99,
                "cpu_ms": cpu,
            }
    print(
        table(
            [
                "concurrency",
                "path",
                "completions/s",
                "x direct",
                "added p50/p99 ms",
                "dispatcher CPU ms/call",
                "Valkey CPU ms/call",
            ],
            rows,
        )
    )
    return summary


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--before", help="git revision to compare against (exported with git archive)")
    parser.add_argument("--before-loop", choices=["asyncio"], help="run the 'before' dispatcher on asyncio")
    args = parser.parse_args(argv)
    runs = args.runs or (1 if args.quick else 5)
    with contextlib.ExitStack() as stack:
        variants: dict[str, tuple[Path, dict[str, str]]] = {}
        if args.before or args.before_loop:
            root = stack.enter_context(exported(args.before)) if args.before else ROOT
            env = {"BENCH_LOOP": args.before_loop} if args.before_loop else {}
            variants[
                f"before ({args.before or 'HEAD'}{', ' + args.before_loop if args.before_loop else ''})"
            ] = (
                root,
                env,
            )
        variants["after (this checkout)"] = (ROOT, {})
        results = asyncio.run(measure(variants, args.quick, runs))
    return report(results, list(variants), runs, args.quick)


if __name__ == "__main__":
    main()
