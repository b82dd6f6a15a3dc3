"""DRR fairness: dispatched cost share per pool against the configured weights, all pools backlogged.

Run: ``python bench/bench_fairness.py [--quick] [--runs N]``.

Every pool is preloaded with enough requests to stay backlogged for the whole run; costs are mixed
(``cost_units`` uniform in 1..4 for even pools, 1..16 for odd pools, seeded). One real dispatcher
process serves the group against a zero-latency simulator process with a small group total (8), so the
scheduler decides who gets every slot. When at least ``TOTAL`` requests have left their queues, the
lists are read in one pipeline: a pool's dispatched cost is the sum of the costs of the items gone from
its head (queues are FIFO within a pool), so the measurement does not trust the dispatcher's counters.
The baseline is the configured share (quantum / sum of quanta).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    client,
    dispatcher_procs,
    group,
    machine,
    median,
    new_keys,
    preload,
    private_valkey,
    publish,
    run_benchmark,
    simulator_proc,
    table,
)
from runtime.producer import Producer
from runtime.wire.groupconfig import PoolConfig

SCENARIOS = {"4:1": (4, 1), "1:1:2:4": (1, 1, 2, 4)}
GROUP_TOTAL = 8
TARGET_PP = 2.0


def jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


async def one_run(valkey_url: str, sim_url: str, weights: tuple[int, ...], total: int, seed: int) -> dict:
    rng = random.Random(seed)
    keys = new_keys()
    pools = [f"p{i}" for i in range(len(weights))]
    config = group(
        sim_url,
        [
            PoolConfig(p, quantum=4 * w, max_concurrent=GROUP_TOTAL)
            for p, w in zip(pools, weights, strict=True)
        ],
        total=GROUP_TOTAL,
    )
    share = [w / sum(weights) for w in weights]
    costs = {
        p: [rng.randint(1, 4 if i % 2 == 0 else 16) for _ in range(total + 300)]  # never drains
        for i, p in enumerate(pools)
    }
    async with client(valkey_url) as conn, Producer(conn, keys=keys, producer_id="fair") as producer:
        for p in pools:
            await preload(conn, keys, p, producer.producer_id, costs[p])
        await publish(conn, keys, config)
        with dispatcher_procs(valkey_url, keys.prefix, config.group_id, 1, GROUP_TOTAL):
            started = time.perf_counter()
            while True:
                async with conn.pipeline(transaction=False) as pipe:
                    for p in pools:
                        pipe.llen(keys.requests(p))
                    lengths = await pipe.execute()
                gone = [len(costs[p]) - n for p, n in zip(pools, lengths, strict=True)]
                if sum(gone) >= total:
                    break
                await asyncio.sleep(0.02)
            elapsed = time.perf_counter() - started
    dispatched = [sum(costs[p][:g]) for p, g in zip(pools, gone, strict=True)]
    measured = [d / sum(dispatched) for d in dispatched]
    return {
        "requests": sum(gone),
        "rate": sum(gone) / elapsed,
        "share": measured,
        "target": share,
        "error_pp": max(abs(m - t) * 100 for m, t in zip(measured, share, strict=True)),
        "jain": jain([m / t for m, t in zip(measured, share, strict=True)]),
        "backlogged": min(lengths) > 0,
    }


async def measure(quick: bool, runs: int) -> dict[str, list[dict]]:
    total = 1000 if quick else 10_000
    results: dict[str, list[dict]] = {name: [] for name in SCENARIOS}
    with private_valkey() as valkey_url, simulator_proc() as sim_url:
        for run in range(runs):
            for name, weights in SCENARIOS.items():
                results[name].append(await one_run(valkey_url, sim_url, weights, total, seed=run))
    return results


def report(results: dict[str, list[dict]], runs: int, quick: bool) -> list[dict]:
    rows, summary = [], []
    for name, rs in results.items():
        n = len(rs[0]["target"])
        shares = [median([r["share"][i] for r in rs]) * 100 for i in range(n)]
        error = median([r["error_pp"] for r in rs])
        j = median([r["jain"] for r in rs])
        rows.append(
            [
                name,
                " : ".join(f"{t * 100:.1f}" for t in rs[0]["target"]),
                " : ".join(f"{s:.1f}" for s in shares),
                f"{error:.2f}",
                f"{j:.5f}",
                f"{median([r['requests'] for r in rs]):.0f}",
                f"{median([r['rate'] for r in rs]):.0f}",
                "yes" if all(r["backlogged"] for r in rs) else "NO",
            ]
        )
        summary.append({"scenario": name, "error_pp": error, "jain": j})
    print(f"# fairness: DRR cost share vs configured, median of {runs} runs{' (quick)' if quick else ''}")
    print(f"# {machine()}")
    print(
        table(
            [
                "weights",
                "configured %",
                "dispatched cost %",
                "max abs error pp",
                "Jain (share/target)",
                "requests",
                "req/s",
                "all backlogged",
            ],
            rows,
        )
    )
    ok = all(s["error_pp"] <= TARGET_PP for s in summary)
    print(f"target: error <= {TARGET_PP} pp ->", "met" if ok else "MISSED")
    return summary


def main(argv: list[str] | None = None) -> list[dict]:
    return run_benchmark(__doc__ or "", measure, report, argv)  # type: ignore[no-any-return]


if __name__ == "__main__":
    main()
