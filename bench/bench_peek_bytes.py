"""Valkey bytes per scheduling round while every pool is at its cap: small against 4 MB envelopes.

Run: ``python bench/bench_peek_bytes.py [--quick] [--runs N]``.

A private Valkey, the simulator and one dispatcher run in this process's event loop. Three pools of
``max_concurrent`` 1 each run one slow call (so every pool is at its cap) with two envelopes queued
behind it: six queued envelopes, either small (~300 bytes, the baseline) or 4 MB each. Valkey's
``INFO stats`` ``total_net_output_bytes`` is read before and after ``ROUNDS`` scheduling rounds; the
table shows the median over runs of the bytes Valkey sent per round, and the ratio 4 MB / small. A
pool that cannot launch must cost O(1) small reads per round, so the ratio should stay near 1
(issue 9: before, every round re-read the first 8 items of every list, ~24 MB here).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    client,
    group,
    machine,
    median,
    new_keys,
    private_valkey,
    publish,
    run_benchmark,
    table,
)
from runtime.config import DispatcherSettings
from runtime.dispatch.dispatcher import Dispatcher
from runtime.producer import Producer
from runtime.wire.contract import ChatCall, Envelope
from runtime.wire.groupconfig import PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer

POOLS = ("a", "b", "c")
QUEUED_PER_POOL = 2
SIZES = {"small": 16, "4MB": 4 * 1024 * 1024}  # message characters


def queued_item(producer_id: str, pool_id: str, chars: int) -> bytes:
    call = ChatCall.from_openai(
        {"model": "sim-model", "messages": [{"role": "user", "content": "x" * chars}]}
    )
    return Envelope(uuid.uuid4().hex, producer_id, pool_id, call, enqueued_at=time.time()).encode()


async def bytes_per_round(valkey_url: str, sim_url: str, chars: int, rounds: int) -> float:
    keys = new_keys()
    config = group(sim_url, [PoolConfig(pool_id=p, max_concurrent=1) for p in POOLS], total=8)
    async with client(valkey_url) as conn, Producer(conn, keys=keys) as producer:
        await publish(conn, keys, config)
        settings = DispatcherSettings(group_id=config.group_id, shutdown_grace_s=0.2)
        dispatcher = Dispatcher(conn, settings, keys=keys)
        task = asyncio.create_task(dispatcher.run(install_signal_handlers=False))
        slow = {
            "model": "sim-model",
            "messages": [{"role": "user", "content": "hi"}],
            "sim": {"latency_ms": 60_000},
        }
        running = [asyncio.create_task(producer.submit(slow, pool_id=p, timeout=120)) for p in POOLS]
        while len(dispatcher.running) < len(POOLS):
            await asyncio.sleep(0.01)
        for pool_id in POOLS:
            items = [queued_item(producer.producer_id, pool_id, chars) for _ in range(QUEUED_PER_POOL)]
            await conn.rpush(keys.requests(pool_id), *items)
        start_round = dispatcher.stats.rounds
        while dispatcher.stats.rounds < start_round + 5:  # settle: the first head of each pool is read once
            await asyncio.sleep(0.01)
        first_round, sent = dispatcher.stats.rounds, int((await conn.info("stats"))["total_net_output_bytes"])
        while dispatcher.stats.rounds < first_round + rounds:
            await asyncio.sleep(0.01)
        done = dispatcher.stats.rounds - first_round
        per_round = (int((await conn.info("stats"))["total_net_output_bytes"]) - sent) / done
        for call in running:
            call.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        dispatcher.request_stop()
        await task
    return per_round


async def measure(quick: bool, runs: int) -> dict[str, list[float]]:
    rounds = 20 if quick else 60
    results: dict[str, list[float]] = {name: [] for name in SIZES}
    with private_valkey() as valkey_url:
        async with SimulatorServer(SimulatorConfig()) as sim:
            for _ in range(runs):
                for name, chars in SIZES.items():  # interleaved: both sizes see the same machine state
                    results[name].append(await bytes_per_round(valkey_url, sim.url, chars, rounds))
    return results


def report(results: dict[str, list[float]], runs: int, quick: bool) -> dict[str, Any]:
    small, big = median(results["small"]), median(results["4MB"])
    print(f"# Valkey bytes per round, every pool at its cap ({runs} runs{', quick' if quick else ''})")
    print(machine())
    rows = [
        [name, f"{median(values):,.0f}", ", ".join(f"{v:,.0f}" for v in values)]
        for name, values in results.items()
    ]
    print(table(["queued envelopes", "median bytes/round", "runs"], rows))
    print(f"ratio 4MB / small: {big / small:.2f}")
    return {"small": small, "big": big, "ratio": big / small}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_benchmark(__doc__ or "", measure, report, argv, default_runs=5)


if __name__ == "__main__":
    main(sys.argv[1:])
