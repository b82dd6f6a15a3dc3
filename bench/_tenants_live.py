"""The live scenarios of ``bench/bench_tenants.py`` (issue 22, phase 2): a private Valkey, a simulator
process and a dispatcher process; the producer runs in the benchmark's own process.

* noisy neighbour: one pool, 4 slots, 40 ms calls. Tenant A queues 600 calls at once; tenant B
  submits one call every 100 ms. B's queue waits (p50/p99) against the p99 time from a submission
  to the pool's next completion (the wait for a slot, whoever's backlog is queued), fairness ``off``
  vs ``tokens``.
* token fairness: two tenants backlogged in one pool (8 slots), A's calls answer 64 tokens and B's
  16, both estimated right; weights 1:1 and 2:1: the served weighted tokens (1 x prompt + 4 x
  output, from the completions' usage) over the run, as A's share against the weights'.
* throughput: 4,000 zero-latency calls from 1,000 tenants (closed loop, 256 in flight): completions
  per second with fairness ``off`` and ``tokens``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from bench._common import (
    client,
    dispatcher_procs,
    group,
    new_keys,
    pct,
    private_valkey,
    publish,
    simulator_proc,
)
from runtime.producer import Producer
from runtime.wire.groupconfig import GroupConfig, PoolConfig

POOL = "chat"


def _call(i: int, latency_ms: float, tokens: int) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": f"request {i}"}],
        "max_tokens": tokens,
        "sim": {"latency_ms": latency_ms, "completion_tokens": tokens},
    }


def _config(url: str, fairness: str, slots: int) -> GroupConfig:
    pool = PoolConfig(POOL, max_concurrent=slots, tenant_fairness=fairness)
    return group(url, [pool], total=slots, group_id="tenants")


async def _with_stack(fairness: str, slots: int, body: Any) -> Any:  # type: ignore[no-untyped-def]
    with private_valkey() as url, simulator_proc() as sim:
        keys = new_keys()
        async with client(url) as conn:
            await publish(conn, keys, _config(sim, fairness, slots))
            with dispatcher_procs(url, keys.prefix, "tenants", 1, slots):
                async with Producer(conn, keys=keys) as producer:
                    return await body(producer)


async def noisy_neighbour(fairness: str) -> dict[str, float]:
    async def body(producer: Producer) -> dict[str, float]:
        completions: list[float] = []
        b_waits: list[float] = []
        b_submitted: list[float] = []

        async def one(i: int, tenant: str) -> None:
            if tenant == "b":
                b_submitted.append(time.monotonic())
            result = await producer.submit(_call(i, 40, 16), pool_id=POOL, timeout=300, tenant=tenant)
            completions.append(time.monotonic())
            if tenant == "b":
                b_waits.append(result.timing.queue_wait_s * 1000)

        noisy = [asyncio.create_task(one(i, "a")) for i in range(600)]
        await asyncio.sleep(0.5)
        quiet = []
        for i in range(40):
            quiet.append(asyncio.create_task(one(i, "b")))
            await asyncio.sleep(0.1)
        await asyncio.gather(*quiet)
        for task in noisy:
            task.cancel()
        await asyncio.gather(*noisy, return_exceptions=True)
        ordered = sorted(completions)
        to_next = [
            (next((c for c in ordered if c > t), t) - t) * 1000 for t in b_submitted
        ]  # a submission's wait for the pool's next completion, whoever's it is
        return {"b_p50": pct(b_waits, 0.5), "b_p99": pct(b_waits, 0.99), "next_p99": pct(to_next, 0.99)}

    return await _with_stack(fairness, 4, body)


async def token_share(weights: tuple[float, float], seconds: float = 6.0) -> tuple[float, float]:
    """A's measured share of the weighted tokens served, and the share its weight asks for."""

    async def body(producer: Producer) -> tuple[float, float]:
        served = {"a": 0.0, "b": 0.0}
        stop = time.monotonic() + seconds
        tokens = {"a": 64, "b": 16}
        weight = {"a": weights[0], "b": weights[1]}

        async def worker(tenant: str, i: int) -> None:
            while time.monotonic() < stop:
                result = await producer.submit(
                    _call(i, 20, tokens[tenant]), pool_id=POOL, timeout=120, tenant=tenant,
                    tenant_weight=weight[tenant],
                )  # fmt: skip
                usage = result.completion["usage"]
                served[tenant] += usage["prompt_tokens"] + 4 * usage["completion_tokens"]

        # 16 callers each: both tenants keep a backlog behind the 8 slots the whole run.
        await asyncio.gather(*(worker(t, i) for t in ("a", "b") for i in range(16)))
        return served["a"] / (served["a"] + served["b"]), weights[0] / (weights[0] + weights[1])

    return await _with_stack("tokens", 8, body)


async def throughput(fairness: str, tenants: int = 1_000, total: int = 4_000) -> float:
    async def body(producer: Producer) -> float:
        remaining = total

        async def worker(w: int) -> None:
            nonlocal remaining
            i = w
            while remaining > 0:
                remaining -= 1
                await producer.submit(_call(i, 0, 16), pool_id=POOL, timeout=120, tenant=f"t{i % tenants}")
                i += 256

        started = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(256)))
        return total / (time.perf_counter() - started)

    return await _with_stack(fairness, 64, body)


def run(runs: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for fairness in ("off", "tokens"):
        rows = [asyncio.run(noisy_neighbour(fairness)) for _ in range(runs)]
        results[f"noisy:{fairness}"] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    for weights in ((1.0, 1.0), (2.0, 1.0)):
        results[f"share:{weights[0]:g}:{weights[1]:g}"] = asyncio.run(token_share(weights))
    for fairness in ("off", "tokens"):
        results[f"rate:{fairness}"] = statistics.median(
            asyncio.run(throughput(fairness)) for _ in range(runs)
        )
    return results


__all__ = ["noisy_neighbour", "run", "throughput", "token_share"]
