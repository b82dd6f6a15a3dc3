"""Durable delivery: its throughput against lists mode, and how soon a killed dispatcher's calls run again.

Run: ``python bench/bench_durable.py [--quick] [--runs N]``.

Throughput: a zero-latency simulator in its own process, one ``bench._dispatcher_proc`` dispatcher, and
``CONCURRENCY`` closed-loop producer workers in this process; the same group published with
``delivery=lists`` and ``delivery=durable``, interleaved run by run; the table shows the median.

Recovery: dispatcher A (lease ``LEASE_S``) holds ``IN_FLIGHT`` calls against a simulator (in this
process) that never answers them in time; dispatcher B runs beside it. A is SIGKILLed; the time from
the kill until the backend has seen every request a second time (B re-executing what A held) is the
recovery time, against the target lease + 1 s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import time
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
    spawn,
    stop_proc,
    table,
    wait_for,
)
from runtime.producer import Producer
from runtime.wire.groupconfig import DURABLE, LISTS, PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer

CONCURRENCY = 128
SLOTS = 128
LEASE_S = 2.0
IN_FLIGHT = 20


async def delivery_rate(valkey_url: str, sim_url: str, delivery: str, total: int) -> float:
    keys = new_keys()
    config = dataclasses.replace(
        group(sim_url, [PoolConfig("default", max_concurrent=SLOTS)], policy="fifo", total=SLOTS),
        delivery=delivery,
    )
    async with client(valkey_url) as conn:
        await publish(conn, keys, config)
        with dispatcher_procs(valkey_url, keys.prefix, config.group_id, 1, SLOTS):
            async with Producer(conn, keys=keys) as producer:
                await closed_loop(producer, "default", CONCURRENCY, total // 10)
                _, wall = await closed_loop(producer, "default", CONCURRENCY, total)
    return total / wall


def hanging_call(key: str) -> dict[str, object]:
    """A call the simulator holds for a minute, counted under ``key`` each time it arrives."""
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "sim": {"latency_ms": 60_000, "key": key},
    }


async def recovery_s(valkey_url: str) -> float:
    """Seconds from SIGKILL of the dispatcher holding IN_FLIGHT calls until all ran again elsewhere."""
    keys = new_keys()
    async with SimulatorServer(SimulatorConfig()) as sim, client(valkey_url) as conn:
        config = dataclasses.replace(
            group(sim.url, [PoolConfig("default", max_concurrent=64)], policy="fifo", total=64),
            delivery=DURABLE,
        )
        await publish(conn, keys, config)
        env = {"BENCH_LEASE_S": str(LEASE_S)}
        doomed = spawn(["-m", "bench._dispatcher_proc", valkey_url, keys.prefix, "bench", "64", "a"], env=env)
        assert doomed.stdout is not None and "ready" in doomed.stdout.readline()
        async with Producer(conn, keys=keys) as producer:
            calls = [
                asyncio.create_task(producer.submit(hanging_call(f"r{i}"), pool_id="default", timeout=120))
                for i in range(IN_FLIGHT)
            ]

            async def all_running() -> bool:
                return len(sim.calls_by_key) == IN_FLIGHT

            await wait_for(all_running, timeout=20)
            survivor = spawn(
                ["-m", "bench._dispatcher_proc", valkey_url, keys.prefix, "bench", "64", "b"], env=env
            )
            assert survivor.stdout is not None and "ready" in survivor.stdout.readline()
            killed_at = time.monotonic()
            os.kill(doomed.pid, signal.SIGKILL)
            doomed.wait(5)

            async def all_again() -> bool:
                return all(n >= 2 for n in sim.calls_by_key.values())

            await wait_for(all_again, timeout=LEASE_S + 30, interval=0.005)
            elapsed = time.monotonic() - killed_at
            stop_proc(survivor)
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
    return elapsed


async def measure(quick: bool, runs: int) -> dict[str, list[float]]:
    total = 600 if quick else 4000
    results: dict[str, list[float]] = {LISTS: [], DURABLE: [], "recovery": []}
    with private_valkey() as valkey_url, simulator_proc() as sim_url:
        for _ in range(runs):
            results[LISTS].append(await delivery_rate(valkey_url, sim_url, LISTS, total))
            results[DURABLE].append(await delivery_rate(valkey_url, sim_url, DURABLE, total))
        for _ in range(runs):
            results["recovery"].append(await recovery_s(valkey_url))
    return results


def report(results: dict[str, list[float]], runs: int, quick: bool) -> dict[str, float]:
    base = median(results[LISTS])
    rows = [
        [name, f"{median(results[name]):.0f}", f"{median(results[name]) / base:.2f}",
         " ".join(f"{x:.0f}" for x in results[name])]
        for name in (LISTS, DURABLE)
    ]  # fmt: skip
    print(
        f"# durable vs lists: {CONCURRENCY} closed-loop workers, one dispatcher ({SLOTS} slots), "
        f"zero-latency simulator, median of {runs} runs{' (quick)' if quick else ''}"
    )
    print(f"# {machine()}")
    print(table(["delivery", "completions/s", "x lists", "runs"], rows))
    ratio = median(results[DURABLE]) / base
    print("target: durable >= 0.85 x lists ->", "met" if ratio >= 0.85 else f"MISSED ({ratio:.2f})")
    recovery = median(results["recovery"])
    print(
        f"recovery: SIGKILL of a dispatcher holding {IN_FLIGHT} calls (lease {LEASE_S:g} s) until the "
        f"backend saw all {IN_FLIGHT} again: median {recovery:.2f} s; runs "
        + " ".join(f"{x:.2f}" for x in results["recovery"])
    )
    print(
        f"target: <= lease + 1 s = {LEASE_S + 1:g} s ->",
        "met" if recovery <= LEASE_S + 1 else f"MISSED ({recovery:.2f})",
    )
    return {"durable_ratio": ratio, "recovery_s": recovery}


def main(argv: list[str] | None = None) -> dict[str, float]:
    return run_benchmark(__doc__ or "", measure, report, argv)  # type: ignore[no-any-return]


if __name__ == "__main__":
    main()
