"""The fleet's shared circuit breaker against a real Valkey: one state, one probe, restarts keep it."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from runtime.backends.shared_breaker import SharedBreakers
from runtime.errors import BackendConnectError, BackendHTTPError
from runtime.queue.keys import KeySpace
from runtime.valkey.client import connect
from runtime.wire.backendconfig import BreakerPolicy

POLICY = BreakerPolicy(failure_threshold=2, open_s=5.0, half_open_probes=1)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def fresh(client: aioredis.Redis, keys: KeySpace, clock: Clock) -> SharedBreakers:
    breakers = SharedBreakers(client, keys, clock=clock)
    breakers.configure({"gpu": POLICY})
    breakers.update("gpu", await client.get(keys.backend_breaker("gpu")))
    return breakers


async def test_opened_by_one_dispatcher_seen_by_another_and_after_a_restart(
    valkey_url: str, keys: KeySpace
) -> None:
    clock = Clock()
    one, two = connect(valkey_url), connect(valkey_url)
    try:
        a, b = await fresh(one, keys, clock), await fresh(two, keys, clock)
        await a.record("gpu", BackendHTTPError("bad request", status_code=400))  # the caller's fault
        await a.record("gpu", BackendConnectError("refused"))
        await b.record("gpu", BackendConnectError("refused"))  # two dispatchers' failures add up
        b.update("gpu", await two.get(keys.backend_breaker("gpu")))
        assert b.blocked("gpu") == "breaker_open" and b.allowance("gpu") == 0
        restarted = await fresh(connect(valkey_url), keys, clock)
        assert restarted.blocked("gpu") == "breaker_open"
        assert restarted.state("gpu").trips == 1
        await restarted.client.aclose()
    finally:
        await one.aclose()
        await two.aclose()


async def test_exactly_one_probe_at_a_time_fleet_wide(valkey_url: str, keys: KeySpace) -> None:
    clock = Clock()
    clients = [connect(valkey_url) for _ in range(6)]
    try:
        fleet = [await fresh(c, keys, clock) for c in clients]
        for _ in range(2):
            await fleet[0].record("gpu", BackendConnectError("refused"))
        clock.now += POLICY.open_s  # open time over: the next call is the probe
        for breakers, client in zip(fleet, clients, strict=True):
            breakers.update("gpu", await client.get(keys.backend_breaker("gpu")))
        answers = await asyncio.gather(*(b.acquire("gpu") for b in fleet for _ in range(3)))
        assert sum(answers) == 1
        winner = next(b for b in fleet if b.state("gpu").mode == "half_open" and b.state("gpu").probes == 1)
        await winner.record("gpu", None)  # the probe succeeded: closed for everyone
        fleet[3].update("gpu", await clients[3].get(keys.backend_breaker("gpu")))
        assert fleet[3].state("gpu").mode == "closed" and await fleet[3].acquire("gpu")
    finally:
        for client in clients:
            await client.aclose()


async def test_a_probe_that_never_happened_is_given_back(aredis: aioredis.Redis, keys: KeySpace) -> None:
    clock = Clock()
    breakers = await fresh(aredis, keys, clock)
    for _ in range(2):
        await breakers.record("gpu", BackendConnectError("refused"))
    clock.now += POLICY.open_s
    breakers.update("gpu", await aredis.get(keys.backend_breaker("gpu")))
    assert await breakers.acquire("gpu") and not await breakers.acquire("gpu")
    await breakers.release("gpu")
    assert await breakers.acquire("gpu")


async def test_a_healthy_backend_costs_no_writes(aredis: aioredis.Redis, keys: KeySpace) -> None:
    breakers = await fresh(aredis, keys, Clock())
    for _ in range(5):
        assert await breakers.acquire("gpu")
        await breakers.record("gpu", None)
    assert await aredis.exists(keys.backend_breaker("gpu")) == 0
