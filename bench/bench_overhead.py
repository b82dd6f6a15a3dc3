"""Added latency of the queued path over a direct call to the same zero-latency simulator.

Run: ``python bench/bench_overhead.py [--quick] [--runs N]``.

The simulator (latency 0) and one dispatcher (``bench._dispatcher_proc``, 256 slots) run as processes
of their own; this process is the producer. At each concurrency (1, 16, 256 closed-loop workers) a run
makes the same number of calls directly (``Producer(direct_backend=...)``, the baseline) and through
the queue, in alternating order. Added latency = queued percentile - direct percentile; the table
shows the median over runs of each percentile.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    client,
    closed_loop,
    dispatcher_procs,
    group,
    machine,
    median,
    new_keys,
    pct,
    private_valkey,
    publish,
    run_benchmark,
    simulator_proc,
    table,
)
from runtime.backends.adapter import OpenAIBackend
from runtime.producer import Producer
from runtime.wire.groupconfig import PoolConfig

LEVELS = (1, 16, 256)
SLOTS = 256
TARGET_P50_MS, TARGET_P99_MS = 1.0, 5.0


def calls_at(concurrency: int, quick: bool) -> int:
    return {1: 100, 16: 320, 256: 512}[concurrency] if quick else {1: 400, 16: 1600, 256: 2560}[concurrency]


async def measure(quick: bool, runs: int) -> dict[tuple[int, str], list[tuple[float, float]]]:
    """(concurrency, path) -> per run (p50 ms, p99 ms)."""
    results: dict[tuple[int, str], list[tuple[float, float]]] = {}
    with private_valkey() as valkey_url, simulator_proc() as sim_url:
        keys = new_keys()
        config = group(sim_url, [PoolConfig("default", max_concurrent=SLOTS)], policy="fifo", total=SLOTS)
        backend = OpenAIBackend(sim_url, max_connections=SLOTS)
        async with client(valkey_url) as conn:
            await publish(conn, keys, config)
            with dispatcher_procs(valkey_url, keys.prefix, config.group_id, 1, SLOTS):
                async with (
                    Producer(conn, keys=keys) as queued,
                    Producer(None, direct_backend=backend) as direct,  # type: ignore[arg-type]
                ):
                    for producer in (direct, queued):  # warm connections and caches
                        await closed_loop(producer, "default", SLOTS, 2 * SLOTS)
                    for run in range(runs):
                        for level in LEVELS:
                            order = [("direct", direct), ("queued", queued)]
                            for name, producer in order if run % 2 == 0 else order[::-1]:
                                lat, _ = await closed_loop(producer, "default", level, calls_at(level, quick))
                                ms = [x * 1000 for x in lat]
                                results.setdefault((level, name), []).append((pct(ms, 0.5), pct(ms, 0.99)))
        await backend.aclose()
    return results


def report(results: dict[tuple[int, str], list[tuple[float, float]]], runs: int, quick: bool) -> list[dict]:
    rows, summary = [], []
    for level in LEVELS:
        d50 = median([r[0] for r in results[(level, "direct")]])
        d99 = median([r[1] for r in results[(level, "direct")]])
        q50 = median([r[0] for r in results[(level, "queued")]])
        q99 = median([r[1] for r in results[(level, "queued")]])
        add50 = median(
            [q[0] - d[0] for q, d in zip(results[(level, "queued")], results[(level, "direct")], strict=True)]
        )
        add99 = median(
            [q[1] - d[1] for q, d in zip(results[(level, "queued")], results[(level, "direct")], strict=True)]
        )
        rows.append(
            [
                level,
                f"{d50:.2f} / {d99:.2f}",
                f"{q50:.2f} / {q99:.2f}",
                f"{add50:+.2f} / {add99:+.2f}",
                f"{q50 / d50:.2f}x / {q99 / d99:.2f}x",
            ]
        )
        summary.append({"concurrency": level, "added_p50_ms": add50, "added_p99_ms": add99})
    mode = " (quick)" if quick else ""
    print(f"# overhead: queued vs direct, zero-latency simulator, median of {runs} runs{mode}")
    print(f"# {machine()}")
    print(
        table(
            ["concurrency", "direct p50/p99 ms", "queued p50/p99 ms", "added p50/p99 ms", "queued/direct"],
            rows,
        )
    )
    at16 = next(s for s in summary if s["concurrency"] == 16)
    ok = at16["added_p50_ms"] <= TARGET_P50_MS and at16["added_p99_ms"] <= TARGET_P99_MS
    print(
        f"target at 16: added p50 <= {TARGET_P50_MS} ms and p99 <= {TARGET_P99_MS} ms ->",
        "met" if ok else "MISSED",
    )
    return summary


def main(argv: list[str] | None = None) -> list[dict]:
    return run_benchmark(__doc__ or "", measure, report, argv, default_runs=5)  # type: ignore[no-any-return]


if __name__ == "__main__":
    main()
