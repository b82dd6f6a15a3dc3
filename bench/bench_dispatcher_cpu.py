"""Dispatcher CPU per call and throughput against direct: this checkout against a "before" variant.

Run: ``python bench/bench_dispatcher_cpu.py [--quick] [--runs N] [--before REF] [--before-loop asyncio]
[--backend-row] [--fair] [--bounded]``.

The same-run before/after figure of each hot-path change (issue 13). Variants: ``after`` (this
checkout) and ``before``: the git revision ``--before`` exported to a scratch directory, and/or this
checkout on asyncio's default loop (``--before-loop asyncio``). Each variant's dispatcher
(``bench._dispatcher_proc``, 64 slots) runs as its own process against one zero-latency simulator
and one private Valkey; this process is the producer (closed loop, same client for every path).
Every run measures ``direct`` (the baseline) and each variant at concurrency 1, 16 and 64, in a
rotating order. Dispatcher CPU per call comes from /proc/<pid>/stat around the measured calls,
Valkey's from ``INFO cpu``, and Valkey's commands (and scripts) per call from ``INFO commandstats``
(the producer's share is the same for every variant; unlike CPU time, these do not move with the
machine's load). At concurrency 1 each run also measures a bare Valkey hop
(``bench._bare_hop_proc``: RPUSH, a worker's BLPOP and RPUSH of the reply, the caller's BLPOP), the
floor the added latency is compared with, and the same hop with its worker on the dispatcher's own
Valkey client and loop; each worker's CPU per hop (two round trips and nothing else) is the floor
the dispatcher's CPU at concurrency 1 is read against. With ``--backend-row`` the pool's calls go through a
backend row, as the demo's and the admin's do (kind vLLM: load gate, shared breaker, the fleet's
scraper on the simulator's ``/metrics``), its gate set never to hold, so that only what a backend row
costs each round shows; without it, through a bare endpoint URL. With ``--fair`` the pool shares
itself between its tenants (``tenant_fairness`` ``tokens``), each closed-loop worker a tenant of its
own (of ``bench._common.FAIR_TENANTS``), as a pool behind the ingress with per-key tenants does. With
``--bounded`` the pool has a ``max_queued`` it never reaches, so that each push goes through admission
control (``lua/admit_push.lua``), as a bounded pool's and a limited ingress key's do.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    CALL,
    FAIR_TENANTS,
    ROOT,
    client,
    closed_loop,
    cpu_seconds,
    dispatcher_procs,
    exported,
    hot_path_group,
    machine,
    measured_load,
    median,
    new_keys,
    oncpu_seconds,
    private_valkey,
    publish,
    simulator_proc,
    spawn,
    stop_proc,
    table,
    valkey_cpu_ms,
)
from runtime.backends.adapter import OpenAIBackend
from runtime.producer import Producer

LEVELS = (1, 16, 64)
SLOTS = 64
BARE = "bare Valkey hop"
# The same hop answered by a worker on the dispatcher's own Valkey client and loop: its CPU per hop is
# what two Valkey round trips cost a process built as the dispatcher is, with no logic around them.
BARE_AS_DISPATCHER = "bare hop, the dispatcher's client"
BARE_WORKERS = {BARE: [], BARE_AS_DISPATCHER: ["--dispatcher-client"]}


def calls_at(level: int, quick: bool) -> int:
    return {1: 100, 16: 400, 64: 640}[level] if quick else {1: 400, 16: 2000, 64: 3200}[level]


class BareHop:
    """The floor at concurrency 1: RPUSH a request, a worker process's BLPOP and RPUSH of the reply,
    and this caller's BLPOP (redis-py with hiredis, as the DESIGN's bare hop). ``submit`` has the
    producer's shape, so the same closed loop measures it."""

    def __init__(self, url: str, requests: str) -> None:
        self.conn = aioredis.Redis.from_url(url)
        self.requests = requests
        self.reply = f"bare:{uuid.uuid4().hex}"[:32].encode()
        self.payload = self.reply + orjson.dumps(CALL)

    async def submit(self, *_: Any, **__: Any) -> None:
        await self.conn.rpush(self.requests, self.payload)
        await self.conn.blpop([self.reply], timeout=10)

    async def aclose(self) -> None:
        await self.conn.aclose()


async def measure(
    variants: dict[str, tuple[Path, dict[str, str]]],
    quick: bool,
    runs: int,
    backend_row: bool = False,
    fair: bool = False,
    bounded: bool = False,
) -> dict:
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
                config = hot_path_group(sim_url, SLOTS, backend_row=backend_row, fair=fair, bounded=bounded)
                await publish(conn, keys, config)
                (proc,) = stack.enter_context(
                    dispatcher_procs(valkey_url, keys.prefix, config.group_id, 1, SLOTS, env=env, root=root)
                )

                async def cpu(pid: int = proc.pid) -> dict[str, float]:
                    commands, scripts = await valkey_commands(conn)
                    return {
                        "dispatcher_ms": cpu_seconds(pid) * 1000,
                        "valkey_ms": await valkey_cpu_ms(conn),
                        "commands": commands,
                        "scripts": scripts,
                    }

                paths[name] = (await producers.enter_async_context(Producer(conn, keys=keys)), cpu)
            tenants = FAIR_TENANTS if fair else 0
            for producer, _ in paths.values():
                await closed_loop(producer, "default", SLOTS, 4 * SLOTS, tenants=tenants)
            names = list(paths)
            hops = await bare_hops(stack, valkey_url)
            for run in range(runs):
                for level in LEVELS:
                    shift = run % len(names)
                    if level == 1:
                        for bare_name, (bare, worker_cpu) in hops.items():
                            sample = await measured_load(bare, 1, calls_at(1, quick), worker_cpu)
                            results.setdefault((1, bare_name), []).append(sample)
                    for name in names[shift:] + names[:shift]:
                        producer, cpu_fn = paths[name]
                        sample = await measured_load(producer, level, calls_at(level, quick), cpu_fn, tenants)
                        results.setdefault((level, name), []).append(sample)
            for bare, _ in hops.values():
                await bare.aclose()
        await backend.aclose()
    return results


async def bare_hops(stack: contextlib.ExitStack, valkey_url: str) -> dict[str, tuple[BareHop, Any]]:
    """Each bare hop's caller (warmed up) and the CPU meter of its worker, by name."""
    hops: dict[str, tuple[BareHop, Any]] = {}
    for name, flags in BARE_WORKERS.items():
        requests = f"bare:{uuid.uuid4().hex}"
        proc = stack.enter_context(worker(["-m", "bench._bare_hop_proc", valkey_url, requests, *flags]))

        async def worker_cpu(pid: int = proc.pid) -> dict[str, float]:
            return {"worker_ms": oncpu_seconds(pid) * 1000}

        hops[name] = (BareHop(valkey_url, requests), worker_cpu)
        await closed_loop(hops[name][0], "default", 1, 100)
    return hops


async def valkey_commands(conn: aioredis.Redis) -> tuple[float, float]:
    """Commands Valkey ran so far (a script's own commands included) and the scripts among them.

    Same for every variant but the dispatcher's: a same-run difference is the dispatcher's, and unlike
    CPU time it does not move with the machine's load."""
    stats = await conn.info("commandstats")
    calls = {name: int(v["calls"]) for name, v in stats.items()}
    scripts = calls.get("cmdstat_evalsha", 0) + calls.get("cmdstat_eval", 0)
    return float(sum(calls.values())), float(scripts)


@contextlib.contextmanager
def worker(args: list[str]) -> Iterator[subprocess.Popen[str]]:
    proc = spawn(args)
    try:
        assert proc.stdout is not None
        if "ready" not in proc.stdout.readline():
            raise RuntimeError(f"{args[1]} did not start")
        yield proc
    finally:
        stop_proc(proc)


def report(
    results: dict,
    variants: list[str],
    runs: int,
    quick: bool,
    backend_row: bool = False,
    fair: bool = False,
    bounded: bool = False,
) -> dict[str, dict[str, float]]:
    print(f"# dispatcher CPU per call and throughput, median of {runs} runs{' (quick)' if quick else ''}")
    print(f"# {machine()}")
    route = "a backend row (kind vLLM)" if backend_row else "a bare endpoint URL"
    print(f"# the pool's calls go through {route}")
    if fair:
        print(f"# the pool is shared fairly by {FAIR_TENANTS} tenants (tenant_fairness tokens), one a worker")
    if bounded:
        print("# the pool is bounded (max_queued, never reached): each push goes through admission control")
    rows: list[list[object]] = []
    summary: dict[str, dict[str, float]] = {}
    for level in LEVELS:
        direct = results[(level, "direct")]
        for name in ["direct", *variants]:
            samples = results[(level, name)]
            ratio = median([s["rate"] / d["rate"] for s, d in zip(samples, direct, strict=True)])
            added = median([s["p50"] - d["p50"] for s, d in zip(samples, direct, strict=True)])
            added99 = median([s["p99"] - d["p99"] for s, d in zip(samples, direct, strict=True)])
            cpu = median([s.get("dispatcher_ms", float("nan")) for s in samples])
            vcpu = median([s.get("valkey_ms", float("nan")) for s in samples])
            commands = median([s.get("commands", float("nan")) for s in samples])
            evalsha = median([s.get("scripts", float("nan")) for s in samples])
            rows.append(
                [
                    level,
                    name,
                    f"{median([s['rate'] for s in samples]):.0f}",
                    f"{ratio:.2f}",
                    "-" if name == "direct" else f"{added:+.2f} / {added99:+.2f}",
                    "-" if name == "direct" else f"{cpu:.3f}",
                    "-" if name == "direct" else f"{vcpu:.3f}",
                    "-" if name == "direct" else f"{commands:.1f} / {evalsha:.2f}",
                ]
            )
            summary[f"{level}:{name}"] = {
                "x_direct": ratio,
                "added_p50": added,
                "added_p99": added99,
                "cpu_ms": cpu,
                "commands": commands,
                "scripts": evalsha,
            }
    hop = results[(1, BARE)]
    hop50, hop99 = median([s["p50"] for s in hop]), median([s["p99"] for s in hop])
    summary["1:bare"] = {"p50": hop50, "p99": hop99, "worker_ms": median([s["worker_ms"] for s in hop])}
    as_dispatcher = results[(1, BARE_AS_DISPATCHER)]
    summary["1:bare_as_dispatcher"] = {
        "p50": median([s["p50"] for s in as_dispatcher]),
        "worker_ms": median([s["worker_ms"] for s in as_dispatcher]),
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
                "Valkey commands / scripts per call",
            ],
            rows,
        )
    )
    print(
        f"bare Valkey hop at concurrency 1 (same run): p50 {hop50:.2f} ms, p99 {hop99:.2f} ms;"
        f" its worker's CPU {summary['1:bare']['worker_ms']:.3f} ms per hop (redis-py),"
        f" {summary['1:bare_as_dispatcher']['worker_ms']:.3f} ms on the dispatcher's client and loop"
        f" (hop p50 {summary['1:bare_as_dispatcher']['p50']:.2f} ms): two Valkey round trips, no logic"
    )
    for name in variants:
        at1 = summary[f"1:{name}"]
        print(
            f"{name}: added at concurrency 1 = {at1['added_p50'] / hop50:.2f}x the hop's p50"
            f" (target <= 1.5x), {at1['added_p99'] / hop99:.2f}x its p99 (target <= 3x)"
        )
    return summary


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--before", help="git revision to compare against (exported with git archive)")
    parser.add_argument("--before-loop", choices=["asyncio"], help="run the 'before' dispatcher on asyncio")
    parser.add_argument(
        "--backend-row", action="store_true", help="route the pool through a backend row, as the demo does"
    )
    parser.add_argument("--fair", action="store_true", help="the pool's tenants share it (tenant_fairness)")
    parser.add_argument("--bounded", action="store_true", help="the pool has max_queued: pushes are admitted")
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
        results = asyncio.run(measure(variants, args.quick, runs, args.backend_row, args.fair, args.bounded))
    return report(results, list(variants), runs, args.quick, args.backend_row, args.fair, args.bounded)


if __name__ == "__main__":
    main()
