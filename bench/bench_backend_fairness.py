"""Fairness through the backend: interactive latency under a backfill flood, load gating off and on.

Run: ``python bench/bench_backend_fairness.py [--quick] [--runs N]``.

The simulator behaves like a vLLM server with its own FIFO queue (``--max-running 4``, 40 ms per
call); the group total is 32, an untuned operator setting far above what the backend runs at once.
Interactive (weight 4) gets one call every 60 ms; backfill (weight 1) is preloaded with a flood.
Without gating the dispatcher sends up to 32 calls, 28 of which wait in the backend's FIFO where
weights mean nothing; with gating (the backend row's defaults: ``max_waiting`` 5, KV usage 0.8,
scraped every 250 ms) the surplus waits in our queue, where DRR serves interactive first.

A last scenario tightens the backend row's ``max_waiting`` to 2 (an operator's tuning).

Reported: interactive p50/p99 *total* latency (submit to reply) per scenario, its ratio to the same
gating mode without flood, and the completion rate of the flooded runs (gated against ungated).
Then the scrape cost: CPU per second of one process scraping one backend every 250 ms.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    CALL,
    client,
    dispatcher_procs,
    group,
    machine,
    median,
    new_keys,
    pct,
    preload,
    private_valkey,
    publish,
    run_benchmark,
    simulator_proc,
    table,
)
from runtime.backends.scraper import BackendScraper
from runtime.producer import Producer
from runtime.wire.backendconfig import BackendConfig
from runtime.wire.groupconfig import PoolConfig

MAX_RUNNING = 4
LATENCY_MS = 40
TOTAL = 32
INTERVAL_S = 0.06
TARGET_RATIO = 2.0
TARGET_THROUGHPUT = 0.95
# name: (gating, flooded, max_waiting)
SCENARIOS = {
    "ungated, no flood": (False, False, 5),
    "ungated, flood": (False, True, 5),
    "gated, no flood": (True, False, 5),
    "gated, flood": (True, True, 5),
    "gated max_waiting 2, flood": (True, True, 2),
}


async def one_run(valkey_url: str, sim_url: str, scenario: str, calls: int, flood: int) -> dict:
    gating, flooded, max_waiting = SCENARIOS[scenario]
    keys = new_keys()
    backend = BackendConfig(
        "sim", sim_url, kind="vllm", max_in_flight=TOTAL, load_gating=gating, max_waiting=max_waiting
    )
    config = replace(
        group(
            sim_url,
            [
                PoolConfig("interactive", quantum=4, max_concurrent=TOTAL, max_burst_per_visit=4),
                PoolConfig("backfill", quantum=1, max_concurrent=TOTAL),
            ],
            total=TOTAL,
        ),
        backend_id="sim",
        backends=(backend,),
    )
    async with (
        client(valkey_url) as conn,
        Producer(conn, keys=keys, producer_id="interactive") as producer,
        Producer(conn, keys=keys, producer_id="backfill") as backfill,
    ):
        await publish(conn, keys, config)
        with dispatcher_procs(valkey_url, keys.prefix, config.group_id, 1, TOTAL):
            for _ in range(3):  # warm up: the dispatcher's first call opens its backend connections
                await producer.submit(CALL, pool_id="interactive", timeout=120)
            if flooded:
                await preload(conn, keys, "backfill", backfill.producer_id, [None] * flood)
                await asyncio.sleep(1.0)  # the flood reaches the backend (and its first scrape)
            left_before = await conn.llen(keys.requests("backfill"))
            started = time.perf_counter()
            tasks = []

            async def timed() -> float:
                t0 = time.perf_counter()
                await producer.submit(CALL, pool_id="interactive", timeout=120)
                return time.perf_counter() - t0

            for _ in range(calls):
                tasks.append(asyncio.create_task(timed()))
                await asyncio.sleep(INTERVAL_S)
            latencies = await asyncio.gather(*tasks)
            elapsed = time.perf_counter() - started
            drained = left_before - await conn.llen(keys.requests("backfill"))
    ms = [x * 1000 for x in latencies]
    return {
        "p50": pct(ms, 0.5),
        "p99": pct(ms, 0.99),
        "rate": (drained + calls) / elapsed,
    }


async def scrape_cost(sim_url: str, valkey_url: str, seconds: float) -> tuple[float, float, int]:
    """CPU seconds per wall second of this process while it scrapes one backend, and while idle."""
    async with client(valkey_url) as conn:
        idle_cpu, idle_wall = time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        idle = (time.process_time() - idle_cpu) / (time.perf_counter() - idle_wall)
        scraper = BackendScraper(conn, new_keys(), owner_id="bench")
        scraper.configure([BackendConfig("sim", sim_url)])
        finished = asyncio.Event()
        cpu, wall = time.process_time(), time.perf_counter()
        task = asyncio.create_task(scraper.run(finished, on_error=lambda exc: None))
        await asyncio.sleep(seconds)
        finished.set()
        await task
        busy = (time.process_time() - cpu) / (time.perf_counter() - wall)
        return busy, idle, scraper.stats.scrapes


async def measure(quick: bool, runs: int) -> dict:
    calls, flood = (30, 400) if quick else (150, 3000)
    results: dict[str, list[dict]] = {name: [] for name in SCENARIOS}
    args = ("--max-running", str(MAX_RUNNING), "--latency-ms", str(LATENCY_MS))
    with private_valkey() as valkey_url, simulator_proc(*args) as sim_url:
        for _ in range(runs):
            for name in SCENARIOS:
                results[name].append(await one_run(valkey_url, sim_url, name, calls, flood))
        cost = [await scrape_cost(sim_url, valkey_url, 2.0 if quick else 5.0) for _ in range(runs)]
    return {"results": results, "cost": cost}


def report(measured: dict, runs: int, quick: bool) -> None:
    results = measured["results"]
    p99 = {name: median([r["p99"] for r in rs]) for name, rs in results.items()}
    p50 = {name: median([r["p50"] for r in rs]) for name, rs in results.items()}
    rate = {name: median([r["rate"] for r in rs]) for name, rs in results.items()}
    rows = []
    for name in SCENARIOS:
        base = "gated, no flood" if name.startswith("gated") else "ungated, no flood"
        rows.append([name, f"{p50[name]:.0f}", f"{p99[name]:.0f}", f"{p99[name] / p99[base]:.2f}x",
                     f"{rate[name]:.1f}"])  # fmt: skip
    print(
        f"# fairness through the backend: interactive total latency, simulator max_running={MAX_RUNNING} "
        f"latency={LATENCY_MS} ms, group total {TOTAL}, median of {runs} runs{' (quick)' if quick else ''}"
    )
    print(f"# {machine()}")
    print(table(["scenario", "p50 ms", "p99 ms", "p99 vs no flood (same mode)", "calls/s"], rows))
    ratio = p99["gated, flood"] / p99["gated, no flood"]
    throughput = rate["gated, flood"] / rate["ungated, flood"]
    print(f"gated p99 flood / no flood = {ratio:.2f}x (target <= {TARGET_RATIO}x):",
          "met" if ratio <= TARGET_RATIO else "MISSED")  # fmt: skip
    print(f"ungated p99 flood / no flood = {p99['ungated, flood'] / p99['ungated, no flood']:.2f}x")
    tuned = p99["gated max_waiting 2, flood"] / p99["gated, no flood"]
    print(f"gated with max_waiting 2: p99 flood / no flood = {tuned:.2f}x")
    print(f"throughput under flood, gated / ungated = {throughput:.2f}x (target >= {TARGET_THROUGHPUT}x):",
          "met" if throughput >= TARGET_THROUGHPUT else "MISSED")  # fmt: skip
    busy = median([c[0] for c in measured["cost"]])
    idle = median([c[1] for c in measured["cost"]])
    scrapes = median([c[2] for c in measured["cost"]])
    print(
        f"scrape cost: {1000 * (busy - idle):.1f} ms CPU per second per backend "
        f"({1000 * busy:.1f} scraping vs {1000 * idle:.1f} idle, {scrapes:.0f} scrapes per run)"
    )


def main(argv: list[str] | None = None) -> None:
    run_benchmark(__doc__ or "", measure, report, argv)


if __name__ == "__main__":
    main()
