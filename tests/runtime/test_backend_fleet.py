"""BackendFleet's breaker questions against a real Valkey: the synchronous answer (acquire_now)
never contradicts the awaited one, for bare URLs (local breakers) and backend rows (shared)."""

from __future__ import annotations

import redis.asyncio as aioredis

from runtime.backends.fleet import BackendFleet
from runtime.backends.health import EndpointBreakers
from runtime.errors import BackendConnectError
from runtime.queue.keys import KeySpace
from runtime.wire.backendconfig import BackendConfig, BreakerPolicy

POLICY = BreakerPolicy(failure_threshold=2, open_s=5.0, half_open_probes=1)
URL = "http://bare:1/v1"
GPU = BackendConfig("gpu", "http://gpu:8000/v1", breaker_failures=2, breaker_open_s=5.0, breaker_probes=1)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def fleet(client: aioredis.Redis, keys: KeySpace, clock: Clock) -> BackendFleet:
    result = BackendFleet(
        client, keys, owner_id="d1", local=EndpointBreakers(POLICY, clock=clock), clock=clock
    )
    result.configure((GPU,))
    return result


async def test_a_bare_url_is_answered_without_a_round_trip(aredis: aioredis.Redis, keys: KeySpace) -> None:
    clock = Clock()
    backends = fleet(aredis, keys, clock)
    assert backends.acquire_now("", URL) is True
    for _ in range(2):
        await backends.record("", URL, BackendConnectError("refused"))
    assert backends.acquire_now("", URL) is False  # open
    clock.now += POLICY.open_s
    assert backends.acquire_now("", URL) is True  # the probe slot, taken
    assert backends.acquire_now("", URL) is False
    backends.local.release(URL)
    assert await backends.acquire("", URL) is True  # the awaited path agrees


async def test_a_backend_row_is_answered_now_only_while_closed(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    clock = Clock()
    backends = fleet(aredis, keys, clock)
    await backends.refresh()
    assert backends.acquire_now("gpu", GPU.base_url) is True
    assert backends.acquire_now("unknown", "http://x/v1") is True  # no breaker configured: acquire says True
    assert await backends.acquire("unknown", "http://x/v1") is True
    for _ in range(2):
        await backends.record("gpu", GPU.base_url, BackendConnectError("refused"))
    await backends.refresh()
    assert backends.acquire_now("gpu", GPU.base_url) is None  # open: only the shared state can answer
    assert await backends.acquire("gpu", GPU.base_url) is False
    clock.now += GPU.breaker_open_s
    assert backends.acquire_now("gpu", GPU.base_url) is None
    assert await backends.acquire("gpu", GPU.base_url) is True  # the fleet's one probe
    assert await backends.acquire("gpu", GPU.base_url) is False
