"""Isolation: queue wait of a low-rate interactive pool beside a flooded backfill pool.

Run: ``python bench/bench_isolation.py [--quick] [--runs N]``.

The simulator runs with limited concurrency (``--max-running 4``, 10 ms per call) and the group total
matches it (4), so the dispatcher holds the excess. The backfill pool is preloaded with a flood
(``FLOOD`` requests, >= 100x the interactive backlog, which stays at 0-1); the interactive pool gets one
request every 40 ms. Scenarios, each with a fresh key space and dispatcher process:

* ``no flood``: DRR, interactive alone (the baseline);
* ``DRR``: DRR 1:1, backfill may use every slot (work-conserving);
* ``DRR, protected slot``: the same, with interactive ``min_concurrent`` = 1: backfill still gets every
  slot while interactive is idle, but a freed slot goes to interactive as soon as it has backlog;
* ``DRR, headroom``: DRR 1:1 with backfill ``max_concurrent`` = total - 1;
* ``FIFO``: FIFO over both pools.

Queue wait is what the dispatcher reports in the reply (call start - enqueued_at).
"""

from __future__ import annotations

import asyncio
import sys
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
from runtime.producer import Producer
from runtime.wire.groupconfig import PoolConfig

TOTAL = 4
LATENCY_MS = 10
INTERVAL_S = 0.04
TARGET_RATIO = 2.0
# name: (policy, flooded, backfill max_concurrent, interactive min_concurrent)
SCENARIOS = {
    "no flood (DRR)": ("drr", False, TOTAL, 0),
    "DRR + flood": ("drr", True, TOTAL, 0),
    "DRR + flood, protected slot": ("drr", True, TOTAL, 1),
    "DRR + flood, headroom": ("drr", True, TOTAL - 1, 0),
    "FIFO + flood": ("fifo", True, TOTAL, 0),
}


async def one_run(valkey_url: str, sim_url: str, scenario: str, calls: int, flood: int) -> dict:
    policy, flooded, backfill_max, interactive_min = SCENARIOS[scenario]
    keys = new_keys()
    config = group(
        sim_url,
        [
            PoolConfig("interactive", quantum=1, max_concurrent=TOTAL, min_concurrent=interactive_min),
            PoolConfig("backfill", quantum=1, max_concurrent=backfill_max),
        ],
        policy=policy,
        total=TOTAL,
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
                await asyncio.sleep(0.05)
            tasks, flood_seen, backlog_seen = [], [], [0]
            for _ in range(calls):
                tasks.append(asyncio.create_task(producer.submit(CALL, pool_id="interactive", timeout=120)))
                await asyncio.sleep(INTERVAL_S)
                async with conn.pipeline(transaction=False) as pipe:
                    pipe.llen(keys.requests("backfill"))
                    pipe.llen(keys.requests("interactive"))
                    flood_n, backlog = await pipe.execute()
                flood_seen.append(flood_n)
                backlog_seen.append(backlog)
            results = await asyncio.gather(*tasks)
    waits = [r.timing.queue_wait_s * 1000 for r in results]
    return {
        "p50": pct(waits, 0.5),
        "p99": pct(waits, 0.99),
        "flood_min": min(flood_seen),
        "backlog_max": max(backlog_seen),
    }


async def measure(quick: bool, runs: int) -> dict[str, list[dict]]:
    calls, flood = (25, 600) if quick else (200, 6000)
    results: dict[str, list[dict]] = {name: [] for name in SCENARIOS}
    with (
        private_valkey() as valkey_url,
        simulator_proc("--max-running", str(TOTAL), "--latency-ms", str(LATENCY_MS)) as sim_url,
    ):
        for _ in range(runs):
            for name in SCENARIOS:
                results[name].append(await one_run(valkey_url, sim_url, name, calls, flood))
    return results


def report(results: dict[str, list[dict]], runs: int, quick: bool) -> dict[str, float]:
    base99 = median([r["p99"] for r in results["no flood (DRR)"]])
    base50 = median([r["p50"] for r in results["no flood (DRR)"]])
    rows, summary = [], {}
    for name, rs in results.items():
        p50, p99 = median([r["p50"] for r in rs]), median([r["p99"] for r in rs])
        summary[name] = p99
        rows.append(
            [
                name,
                f"{p50:.2f}",
                f"{p99:.2f}",
                f"{p50 / base50:.1f}x" if base50 > 0 else "-",
                f"{p99 / base99:.1f}x",
                min(r["flood_min"] for r in rs),
                max(r["backlog_max"] for r in rs),
            ]
        )
    print(
        f"# isolation: interactive queue wait, simulator max_running={TOTAL} latency={LATENCY_MS} ms, "
        f"median of {runs} runs{' (quick)' if quick else ''}"
    )
    print(f"# {machine()}")
    print(
        table(
            [
                "scenario",
                "p50 wait ms",
                "p99 wait ms",
                "p50 vs no flood",
                "p99 vs no flood",
                "min flood pending",
                "max interactive pending",
            ],
            rows,
        )
    )
    ratio = summary["DRR + flood"] / base99
    print(
        f"target: DRR p99 with flood <= {TARGET_RATIO}x without ->",
        "met" if ratio <= TARGET_RATIO else f"MISSED ({ratio:.1f}x)",
    )
    return summary


def main(argv: list[str] | None = None) -> dict[str, float]:
    return run_benchmark(__doc__ or "", measure, report, argv)  # type: ignore[no-any-return]


if __name__ == "__main__":
    main()
