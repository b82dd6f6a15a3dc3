"""Scale: scheduler decision cost as pools grow, Valkey memory per pending request, drain time.

Run: ``python bench/bench_scale.py [--quick]``.

* Decision cost: :func:`runtime.policy.scheduler.decide` alone (see ``bench_scheduler.py``), µs per launch
  at 1, 10, 100 and 1,000 backlogged pools, against its own 1-pool figure (growth).
* Memory: ``N`` typical envelopes pushed into one pool; ``INFO memory`` ``used_memory`` growth and
  ``MEMORY USAGE`` of the list, per request, against the envelope's own size (the baseline).
* Drain: ``N`` pending requests in one pool, one dispatcher process (128 slots) against a
  zero-latency simulator process: time until the list is empty and nothing is in flight; the baseline
  is a bare client popping the same list with ``LPOP key 500`` (Valkey's own floor).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench.bench_scheduler as sched
from bench._common import (
    CALL,
    client,
    dispatcher_procs,
    group,
    machine,
    median,
    new_keys,
    preload,
    private_valkey,
    publish,
    simulator_proc,
    table,
)
from runtime.wire.contract import ChatCall, Envelope
from runtime.wire.groupconfig import PoolConfig

SLOTS = 128
TARGET_DECISION_US = 20.0


def decision_costs(quick: bool) -> list[list[object]]:
    if quick:
        sched.RUNS, sched.LAUNCHES_PER_RUN = 3, 800
    rows = []
    for name, policy, local in (("DRR, 1 slot free", "drr", 1), ("DRR, 8 slots free", "drr", 8)):
        cells = [sched.measure(n, policy, local, False)[0] / 1000 for n in sched.POOL_COUNTS]
        rows.append([name, *(f"{c:.2f}" for c in cells), f"{cells[-1] / cells[0]:.1f}x"])
    return rows


async def memory(url: str, n: int) -> list[object]:
    keys = new_keys()
    now = time.time()
    sample = Envelope(
        "0" * 32, "producer-0123456789abcdef", "default", ChatCall.from_openai(CALL), now, now + 120
    )
    envelope_bytes = len(sample.encode())
    async with client(url) as conn:
        await conn.execute_command("MEMORY", "PURGE")
        before = int((await conn.info("memory"))["used_memory"])
        await preload(conn, keys, "default", "producer-0123456789abcdef", [None] * n)
        after = int((await conn.info("memory"))["used_memory"])
        usage = int(await conn.execute_command("MEMORY", "USAGE", keys.requests("default"), "SAMPLES", "0"))
        await conn.delete(keys.requests("default"))
    per_info, per_usage = (after - before) / n, usage / n
    return [n, envelope_bytes, f"{per_info:.0f}", f"{per_usage:.0f}", f"{per_usage / envelope_bytes:.2f}x"]


async def drain(valkey_url: str, sim_url: str, n: int, bare: bool) -> float:
    keys = new_keys()
    config = group(sim_url, [PoolConfig("default", max_concurrent=SLOTS)], policy="fifo", total=SLOTS)
    async with client(valkey_url) as conn:
        await conn.set(keys.producer_alive("drain"), b"1", px=900_000)
        await preload(conn, keys, "default", "drain", [None] * n)
        queue, inflight = keys.requests("default"), keys.group_inflight(config.group_id)
        if bare:
            started = time.perf_counter()
            while await conn.lpop(queue, 500):
                pass
            return time.perf_counter() - started
        await publish(conn, keys, config)
        started = time.perf_counter()
        with dispatcher_procs(valkey_url, keys.prefix, config.group_id, 1, SLOTS):
            while True:
                async with conn.pipeline(transaction=False) as pipe:
                    pipe.llen(queue)
                    pipe.zcard(inflight)
                    pending, running = await pipe.execute()
                if pending == 0 and running == 0:
                    break
                await asyncio.sleep(0.02)
            elapsed = time.perf_counter() - started
        await conn.delete(keys.replies("drain"))
    return elapsed


async def io_part(quick: bool) -> tuple[list[list[object]], list[list[object]]]:
    mem_ns = (10_000,) if quick else (10_000, 100_000)
    drain_plan = ((2_000, 1),) if quick else ((10_000, 1), (100_000, 1))
    mem_rows, drain_rows = [], []
    with private_valkey() as valkey_url, simulator_proc() as sim_url:
        for n in mem_ns:
            mem_rows.append(await memory(valkey_url, n))
        for n, runs in drain_plan:
            bare = median([await drain(valkey_url, sim_url, n, True) for _ in range(runs)])
            disp = median([await drain(valkey_url, sim_url, n, False) for _ in range(runs)])
            drain_rows.append(
                [
                    n,
                    runs,
                    f"{disp:.1f}",
                    f"{n / disp:.0f}",
                    f"{bare:.2f}",
                    f"{disp / bare:.0f}x",
                    f"{disp / n * 1e6:.0f}",
                ]
            )
    return mem_rows, drain_rows


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    args = parser.parse_args(argv)
    print(f"# scale{' (quick)' if args.quick else ''}")
    print(f"# {machine()}")
    rows = decision_costs(args.quick)
    print(
        f"\n## decision cost, µs per launch, median of {sched.RUNS} runs x {sched.LAUNCHES_PER_RUN} launches"
    )
    print(table(["scenario", *(f"{n} pools" for n in sched.POOL_COUNTS), "growth 1->1000"], rows))
    worst = max(float(str(r[-2])) for r in rows)
    print(
        f"target: <= {TARGET_DECISION_US} µs at 1,000 pools ->",
        "met" if worst <= TARGET_DECISION_US else "MISSED",
    )
    mem_rows, drain_rows = asyncio.run(io_part(args.quick))
    print("\n## Valkey memory per pending request")
    print(
        table(
            ["pending", "envelope bytes", "used_memory / req", "MEMORY USAGE / req", "vs envelope"], mem_rows
        )
    )
    print("\n## drain N pending requests (one dispatcher, 128 slots, zero-latency simulator)")
    print(
        table(
            ["pending", "runs", "dispatcher s", "req/s", "bare LPOP s", "vs bare LPOP", "µs per request"],
            drain_rows,
        )
    )
    return {"decision_us_1000": worst, "drain_rate": float(str(drain_rows[-1][3]))}


if __name__ == "__main__":
    main()
