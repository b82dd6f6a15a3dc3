"""Completions per second: direct calls vs one and two dispatcher processes, same producer load.

Run: ``python bench/bench_throughput.py [--quick] [--runs N]``.

A zero-latency simulator runs in its own process; the producer load (``CONCURRENCY`` closed-loop
workers in this process) either calls the simulator directly (``Producer(direct_backend=...)``, the
baseline) or submits through Valkey to one or two ``bench._dispatcher_proc`` processes of one fabric
group. Each configuration runs ``RUNS`` times, interleaved; the table shows the median.
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
    private_valkey,
    publish,
    run_benchmark,
    simulator_proc,
    table,
)
from runtime.backends.adapter import OpenAIBackend
from runtime.producer import Producer
from runtime.wire.groupconfig import PoolConfig

CONCURRENCY = 256
PER_DISPATCHER = 128


async def direct_rate(sim_url: str, total: int) -> float:
    backend = OpenAIBackend(sim_url, max_connections=CONCURRENCY)
    try:
        async with Producer(None, direct_backend=backend) as producer:  # type: ignore[arg-type]
            await closed_loop(producer, "default", CONCURRENCY, total // 10)  # warm the connections
            _, wall = await closed_loop(producer, "default", CONCURRENCY, total)
    finally:
        await backend.aclose()
    return total / wall


async def queued_rate(valkey_url: str, sim_url: str, dispatchers: int, total: int) -> float:
    keys = new_keys()
    config = group(
        sim_url,
        [PoolConfig("default", max_concurrent=CONCURRENCY)],
        policy="fifo",
        total=PER_DISPATCHER * dispatchers,
    )
    async with client(valkey_url) as conn:
        await publish(conn, keys, config)
        with dispatcher_procs(valkey_url, keys.prefix, config.group_id, dispatchers, PER_DISPATCHER):
            async with Producer(conn, keys=keys) as producer:
                await closed_loop(producer, "default", CONCURRENCY, total // 10)
                _, wall = await closed_loop(producer, "default", CONCURRENCY, total)
    return total / wall


async def measure(quick: bool, runs: int) -> dict[str, list[float]]:
    total = 600 if quick else 4000
    rates: dict[str, list[float]] = {"direct": [], "1 dispatcher": [], "2 dispatchers": []}
    with private_valkey() as valkey_url, simulator_proc() as sim_url:
        for _ in range(runs):
            rates["direct"].append(await direct_rate(sim_url, total))
            rates["1 dispatcher"].append(await queued_rate(valkey_url, sim_url, 1, total))
            if not quick:
                rates["2 dispatchers"].append(await queued_rate(valkey_url, sim_url, 2, total))
    return rates


def report(rates: dict[str, list[float]], runs: int, quick: bool) -> dict[str, float]:
    base = median(rates["direct"])
    rows = [
        [name, f"{median(r):.0f}", f"{median(r) / base:.2f}", " ".join(f"{x:.0f}" for x in r)]
        for name, r in rates.items()
        if r
    ]
    print(
        f"# throughput: {CONCURRENCY} closed-loop workers, {PER_DISPATCHER} slots per dispatcher, "
        f"median of {runs} runs{' (quick)' if quick else ''}"
    )
    print(f"# {machine()}")
    print(table(["path", "completions/s", "x direct", "runs"], rows))
    ratio = median(rates["1 dispatcher"]) / base
    print("target: 1 dispatcher >= 0.60 x direct ->", "met" if ratio >= 0.6 else f"MISSED ({ratio:.2f})")
    return {name: median(r) for name, r in rates.items() if r}


def main(argv: list[str] | None = None) -> dict[str, float]:
    return run_benchmark(__doc__ or "", measure, report, argv)  # type: ignore[no-any-return]


if __name__ == "__main__":
    main()
