"""Long calls at high concurrency, the shape of real LLM traffic: 2,000 in flight, 1 s per call.

Run: ``python bench/bench_longcalls.py [--quick] [--runs N]``.

The simulator answers every call after ``--latency-ms 1000``; the producer (this process) keeps
``IN_FLIGHT`` calls going (closed loop), either directly (``Producer(direct_backend=...)``, the
baseline) or through Valkey to one dispatcher process with ``IN_FLIGHT`` slots. Each run measures
both, alternating which goes first; tables show medians. Reported: completions/s and its ratio to
direct, added p50/p99 latency, the dispatcher's CPU (per call and as a share of one core) and
memory (RSS at the end of the load and its peak, ``VmHWM``, from /proc), and the CPU per call of
every process on the path (this one, the simulator, the dispatcher, Valkey): on two cores shared by
four busy processes the ratio follows their sum, which tells whether the path or the harness is slow.

Each measured load is preceded by an unmeasured round of ``IN_FLIGHT`` calls on the same path: the
backend client closes connections idle for ``KEEPALIVE_S`` (4 s), longer than the other path's load,
so without it every load began by reopening 2,000 connections at once against the simulator's
listen backlog (1,024), a cost steady traffic never pays.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    client,
    closed_loop,
    cpu_seconds,
    dispatcher_procs,
    group,
    machine,
    median,
    new_keys,
    pct,
    private_valkey_server,
    publish,
    run_benchmark,
    simulator_process,
    table,
)
from runtime.backends.adapter import OpenAIBackend
from runtime.producer import Producer
from runtime.wire.groupconfig import PoolConfig

LATENCY_MS = 1000
TARGET_X_DIRECT = 0.95  # issue 23 (issue 13 asked for 0.9)


def shape(quick: bool) -> tuple[int, int]:
    """(calls in flight, calls per measured load)."""
    return (500, 1000) if quick else (2000, 6000)


def steady(finished: list[tuple[float, Any]], in_flight: int) -> dict[str, float]:
    """The load's middle, free of its start (every worker submits at once) and its tail (the last
    chains finishing one by one): completions/s with the first and the last ``in_flight``
    completions left out (a quarter of the load at either end when that is less); and, per call
    (p50, ms), the dispatcher's timing of its queue wait and of its execution."""
    ends = [end for end, _ in finished]
    first = min(in_flight, len(ends) // 4)  # a --quick load is only two windows long
    last = len(ends) - first
    rate = (last - first) / (ends[last] - ends[first]) if last > first else 0.0
    timings = [result.timing for _, result in finished]
    return {
        "steady_rate": rate,
        "queue_wait_p50": pct([t.queue_wait_s * 1000 for t in timings], 0.5),
        "execution_p50": pct([t.execution_s * 1000 for t in timings], 0.5),
    }


def memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return tuple(int(fields[name].split()[0]) / 1024 for name in ("VmRSS", "VmHWM"))  # type: ignore[return-value]


async def measure(quick: bool, runs: int) -> dict[str, list[dict[str, float]]]:
    in_flight, total = shape(quick)
    samples: dict[str, list[dict[str, float]]] = {"direct": [], "queued": []}
    with (
        private_valkey_server() as valkey,
        simulator_process("--latency-ms", str(LATENCY_MS)) as (sim_url, sim),
    ):
        valkey_url = valkey.url
        keys = new_keys()
        config = group(
            sim_url, [PoolConfig("default", max_concurrent=in_flight)], policy="fifo", total=in_flight
        )
        backend = OpenAIBackend(sim_url, max_connections=in_flight)
        async with client(valkey_url) as conn:
            await publish(conn, keys, config)
            with dispatcher_procs(valkey_url, keys.prefix, config.group_id, 1, in_flight) as (proc,):
                async with contextlib.AsyncExitStack() as stack:
                    direct = await stack.enter_async_context(Producer(None, direct_backend=backend))  # type: ignore[arg-type]
                    queued = await stack.enter_async_context(Producer(conn, keys=keys))
                    for producer in (direct, queued):  # open the connections on both paths
                        await closed_loop(producer, "default", in_flight, in_flight)
                    for run in range(runs):
                        order = [("direct", direct), ("queued", queued)]
                        for name, producer in order if run % 2 == 0 else order[::-1]:
                            await closed_loop(producer, "default", in_flight, in_flight)  # reconnect
                            pids = {"sim": sim.pid, "dispatcher": proc.pid, "valkey": valkey.pid}
                            before = {who: cpu_seconds(pid) for who, pid in pids.items()}
                            bench_before = time.process_time()
                            finished: list[tuple[float, Any]] = []
                            latencies, wall = await closed_loop(
                                producer, "default", in_flight, total, finished=finished
                            )
                            used = {who: cpu_seconds(pid) - before[who] for who, pid in pids.items()}
                            used["bench"] = time.process_time() - bench_before
                            cpu = used["dispatcher"]
                            rss, peak = memory_mib(proc.pid)
                            ms = [x * 1000 for x in latencies]
                            sample = {"rate": total / wall, "p50": pct(ms, 0.5), "p99": pct(ms, 0.99)}
                            sample |= steady(finished, in_flight)
                            sample |= {f"{who}_ms": seconds * 1000 / total for who, seconds in used.items()}
                            if name == "queued":
                                sample |= {
                                    "cpu_ms": cpu * 1000 / total,
                                    "core": cpu / wall,
                                    "rss": rss,
                                    "peak": peak,
                                }
                            samples[name].append(sample)
        await backend.aclose()
    return samples


def report(samples: dict[str, list[dict[str, float]]], runs: int, quick: bool) -> dict[str, float]:
    in_flight, total = shape(quick)
    direct, queued = samples["direct"], samples["queued"]
    pairs = list(zip(queued, direct, strict=True))
    summary = {
        "direct_rate": median([d["rate"] for d in direct]),
        "queued_rate": median([q["rate"] for q in queued]),
        "x_direct": median([q["rate"] / d["rate"] for q, d in pairs]),
        "added_p50": median([q["p50"] - d["p50"] for q, d in pairs]),
        "added_p99": median([q["p99"] - d["p99"] for q, d in pairs]),
        "cpu_ms": median([q["cpu_ms"] for q in queued]),
        "core": median([q["core"] for q in queued]),
        "rss": median([q["rss"] for q in queued]),
        "peak": max(q["peak"] for q in queued),
        "steady_x_direct": median([q["steady_rate"] / d["steady_rate"] for q, d in pairs]),
    }
    print(
        f"# long calls: {in_flight} in flight, simulator latency {LATENCY_MS} ms, {total} calls per load, "
        f"median of {runs} runs{' (quick)' if quick else ''}"
    )
    print(f"# {machine()}")
    rows = [
        ["direct", f"{summary['direct_rate']:.0f}", "1.00",
         f"{median([d['p50'] for d in direct]):.1f} / {median([d['p99'] for d in direct]):.1f}",
         "-", "-", "-"],
        ["queued", f"{summary['queued_rate']:.0f}", f"{summary['x_direct']:.2f}",
         f"{median([q['p50'] for q in queued]):.1f} / {median([q['p99'] for q in queued]):.1f}",
         f"{summary['added_p50']:+.1f} / {summary['added_p99']:+.1f}",
         f"{summary['cpu_ms']:.3f} ({summary['core'] * 100:.0f}% of a core)",
         f"{summary['rss']:.0f} / {summary['peak']:.0f}"],
    ]  # fmt: skip
    print(
        table(
            ["path", "completions/s", "x direct", "p50/p99 ms", "added p50/p99 ms", "dispatcher CPU ms/call",
             "dispatcher RSS / peak MiB"],
            rows,
        )
    )  # fmt: skip
    who = ("bench", "sim", "dispatcher", "valkey")
    cpu_rows = [
        [name, *(f"{median([s[f'{w}_ms'] for s in samples[name]]):.3f}" for w in who),
         f"{median([sum(s[f'{w}_ms'] for w in who) for s in samples[name]]):.3f}"]
        for name in ("direct", "queued")
    ]  # fmt: skip
    print(table(["path", "this process (producer)", "simulator", "dispatcher", "Valkey", "sum"], cpu_rows))
    print("# CPU ms per call of each process during the measured loads (direct: the dispatcher idles)")
    print(
        "steady state (the first and the last {n} completions left out): direct {d:.0f}/s, queued {q:.0f}/s"
        " = {x:.2f}x; queued call p50: queue wait {w:.1f} ms, execution {e:.1f} ms".format(
            n=min(in_flight, total // 4),
            d=median([s["steady_rate"] for s in direct]),
            q=median([s["steady_rate"] for s in queued]),
            x=summary["steady_x_direct"],
            w=median([s["queue_wait_p50"] for s in queued]),
            e=median([s["execution_p50"] for s in queued]),
        )
    )
    ok = summary["x_direct"] >= TARGET_X_DIRECT
    print(
        f"target (issue 23): >= {TARGET_X_DIRECT} x direct with {in_flight} in flight ->",
        "met" if ok else f"MISSED ({summary['x_direct']:.2f})",
    )
    return summary


def main(argv: list[str] | None = None) -> dict[str, float]:
    return run_benchmark(__doc__ or "", measure, report, argv)  # type: ignore[no-any-return]


if __name__ == "__main__":
    main()
