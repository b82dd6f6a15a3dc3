"""What a durable push costs: the push script alone against the push followed by WAITAOF.

Run: ``python bench/bench_persisted_push.py [--quick] [--runs N]``.

Each mode gets a private embedded Valkey (AOF on): ``memory`` is the push as a ``lists`` group sends it
(EVALSHA over the shared pipelined connection, answered once Valkey holds it in memory); ``waitaof
everysec`` and ``waitaof always`` send it through :class:`runtime.valkey.persisted.PersistedPusher`
(the push and one WAITAOF in one write, on a connection of its own, batched per fsync) against a server
with that ``appendfsync``. Closed-loop workers push for ``SECONDS`` at concurrency 1 (latency) and
``CONCURRENCY`` (throughput); modes interleave run by run; the table shows medians over runs.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine, median, new_keys, pct, run_benchmark, scratch, table
from runtime.queue import registry
from runtime.queue.keys import WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS
from runtime.valkey import embedded
from runtime.valkey.client import connect
from runtime.valkey.persisted import PersistedPusher

CONCURRENCY = 64
SECONDS = 3.0
MODES = ("memory", "waitaof everysec", "waitaof always")
_PUSH = registry.script("push")
ENVELOPE = b"x" * 600  # about a small chat call's envelope


async def _load(mode: str, url: str, concurrency: int, seconds: float) -> dict[str, float]:
    conn = connect(url)
    keys = new_keys()
    script_keys = [keys.requests("p"), keys.wake_list("p")]
    args = [ENVELOPE, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS]
    pusher = PersistedPusher(conn)
    plain = _PUSH.bind(conn)
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < stop:
            started = time.perf_counter()
            if mode == "memory":
                await plain(keys=script_keys, args=args)
            else:
                await pusher.push(_PUSH, script_keys, args, replicas=0)
            latencies.append(time.perf_counter() - started)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - began
    await pusher.aclose()
    await conn.aclose()
    return {
        "rate": len(latencies) / elapsed,
        "p50_ms": pct(latencies, 0.5) * 1000,
        "p99_ms": pct(latencies, 0.99) * 1000,
        "unpersisted": float(sum(n for k, n in pusher.outcomes.items() if k != "persisted")),
    }


async def measure(quick: bool, runs: int) -> dict[tuple[str, int], list[dict[str, float]]]:
    seconds = 1.0 if quick else SECONDS
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for _ in range(runs):
        for mode in MODES:
            fsync = mode.split()[-1] if mode != "memory" else "everysec"
            with scratch() as data_dir:
                server = embedded.start(data_dir, appendfsync=fsync)
                try:
                    for concurrency in (1, CONCURRENCY):
                        figures = await _load(mode, server.url, concurrency, seconds)
                        results.setdefault((mode, concurrency), []).append(figures)
                finally:
                    embedded.stop(data_dir)
    return results


def report(results: dict[tuple[str, int], list[dict[str, float]]], runs: int, quick: bool) -> Any:
    print(machine())
    print(f"{runs} run(s) of {1.0 if quick else SECONDS:g} s per cell; medians over runs")
    rows = []
    for (mode, concurrency), figures in results.items():
        rows.append([
            mode, concurrency,
            f"{median([f['rate'] for f in figures]):.0f}",
            f"{median([f['p50_ms'] for f in figures]):.2f}",
            f"{median([f['p99_ms'] for f in figures]):.2f}",
            f"{median([f['unpersisted'] for f in figures]):.0f}",
        ])  # fmt: skip
    print(table(["mode", "concurrency", "pushes/s", "p50 ms", "p99 ms", "unpersisted"], rows))
    return results


if __name__ == "__main__":
    run_benchmark(__doc__ or "", measure, report, sys.argv[1:])
