"""Where one call's time goes at concurrency 1: timestamps along its path in the dispatcher.

Run: ``python bench/probe_c1_path.py [--calls 2000] [--runs 3] [--quick]``.

One private Valkey, the zero-latency simulator, one dispatcher process (64 slots, a FIFO group, a
bare endpoint) stamping its path (:mod:`bench._path_stamps`), this process the producer, a closed
loop at concurrency 1. First the producer-direct path (the same ``OpenAIBackend`` in this process,
its HTTP write and first answer bytes stamped the same way), then the queued one, then direct calls
again with the queued path's idle time between them (a backend that idles answers later on a VM).
Prints each event's median time after the call's ``start`` (median over runs), and the whole-call
p50s. The stamps cost a few µs each: the figures place the segments, they are not the bench's latency.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _path_stamps
from bench._common import (
    CALL,
    client,
    closed_loop,
    dispatcher_procs,
    hot_path_group,
    machine,
    median,
    new_keys,
    private_valkey,
    publish,
    scratch,
    simulator_proc,
)
from runtime.backends.adapter import OpenAIBackend
from runtime.backends.http import pool
from runtime.producer import Producer

SLOTS = 64
WARMUP = 300


def http_ms(http: list[tuple[str, float]]) -> float:
    """The median time from a request's write to its answer's first bytes in ``http``'s stamps (ms)."""
    sent = [at for event, at in http if event == "http_sent"]
    answered = [at for event, at in http if event == "http_answer"]
    return median([b - a for a, b in zip(sent, answered, strict=False)]) * 1000


async def direct_with_gaps(
    backend: OpenAIBackend, calls: int, gap_s: float, http: list[tuple[str, float]]
) -> float:
    """Direct calls one at a time with ``gap_s`` idle between them, as the queued path's backend sees
    them: on a VM the backend then answers later (its vCPU idles between requests); write → first
    answer bytes, ms."""
    for _ in range(WARMUP // 3):
        await backend.complete(CALL)
    http.clear()
    for _ in range(calls):
        await backend.complete(CALL)
        await asyncio.sleep(gap_s)
    return http_ms(http)


async def one_run(calls: int, http: list[tuple[str, float]]) -> dict[str, float]:
    """One direct and one queued closed loop, then direct calls spaced as the queued path's; the
    figures of this run (ms). ``http`` receives this process's HTTP stamps."""
    with private_valkey() as url, simulator_proc() as sim_url, scratch() as tmp:
        stamps = tmp / "stamps.txt"
        backend = OpenAIBackend(sim_url, max_connections=SLOTS)
        async with Producer(None, direct_backend=backend) as direct:  # type: ignore[arg-type]
            await closed_loop(direct, "default", 1, WARMUP)
            http.clear()
            direct_latency, _ = await closed_loop(direct, "default", 1, calls)
        figures = {"direct:e2e": median(direct_latency) * 1000, "direct:http": http_ms(http)}
        keys = new_keys()
        config = hot_path_group(sim_url, SLOTS)
        async with client(url) as conn:
            await publish(conn, keys, config)
            env = {"BENCH_PATH_STAMPS": str(stamps)}
            with dispatcher_procs(url, keys.prefix, config.group_id, 1, SLOTS, env=env):
                async with Producer(conn, keys=keys) as producer:
                    await closed_loop(producer, "default", 1, WARMUP)
                    stamps.write_text("")
                    queued_latency, _ = await closed_loop(producer, "default", 1, calls)
        at, typical, total = _path_stamps.offsets(stamps.read_text().splitlines())
        figures["queued:e2e"] = median(queued_latency) * 1000
        # What the backend idles between two queued calls: the whole call but its own answer.
        figures["gap_ms"] = max(0.0, figures["queued:e2e"] - (at["http_answer"] - at["http_sent"]))
        figures["direct_gapped:http"] = await direct_with_gaps(backend, calls, figures["gap_ms"] / 1000, http)
        await backend.aclose()
    figures["typical_share"] = typical / max(1, total)
    return figures | {f"at:{event}": ms for event, ms in at.items()}


def report(runs: list[dict[str, float]]) -> dict[str, float]:
    summary = {name: median([run[name] for run in runs if name in run]) for name in runs[0]}
    print(f"# one call's path at concurrency 1, medians of {len(runs)} run(s); {machine()}")
    print(f"# calls that met the most common set of events: {summary['typical_share']:.0%}")
    print("| event | ms after `start` |")
    print("|---|---|")
    for event, what in _path_stamps.EVENTS:
        if f"at:{event}" in summary:
            print(f"| {what} | {summary[f'at:{event}']:.3f} |")
    http = summary["at:http_answer"] - summary["at:http_sent"]
    direct_http, gapped, gap = summary["direct:http"], summary["direct_gapped:http"], summary["gap_ms"]
    print(
        f"backend request written -> first answer bytes: queued {http:.3f} ms, direct {direct_http:.3f} ms,"
        f" direct with {gap:.2f} ms idle between calls (as the queued path's backend idles) {gapped:.3f} ms"
    )
    print(f"whole call p50: queued {summary['queued:e2e']:.3f} ms, direct {summary['direct:e2e']:.3f} ms")
    return summary


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small smoke run (200 calls, 1 run)")
    args = parser.parse_args(argv)
    calls, runs = (200, 1) if args.quick else (args.calls, args.runs)
    http: list[tuple[str, float]] = []
    with _path_stamps.stamp_http(pool, lambda event: http.append((event, time.perf_counter()))):
        return report([asyncio.run(one_run(calls, http)) for _ in range(runs)])


if __name__ == "__main__":
    main()
