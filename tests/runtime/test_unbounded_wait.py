"""max_queue_wait_s refuses a pool that drains nothing (paused, breaker open) at once, saying why: a real
producer and dispatcher, the real simulator over HTTP, real Valkey."""

from __future__ import annotations

import pytest

from runtime.backends.breaker import OPEN, decode_state
from runtime.errors import BackendHTTPError, QueueFull
from runtime.producer import Producer
from runtime.queue import groups
from runtime.wire.backendconfig import BackendConfig
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from simulator.server import SimulatorServer
from tests.support.dispatching import running_dispatcher

CALL = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}


def config(sim: SimulatorServer, **pool: object) -> GroupConfig:
    backend = BackendConfig(
        "sim", sim.url, kind="openai", load_gating=False, breaker_failures=2, breaker_open_s=30.0
    )
    return GroupConfig(
        group_id="g",
        policy="fifo",
        total_concurrency=4,
        backend_id="sim",
        backends=(backend,),
        pools=(PoolConfig(pool_id="p", max_concurrent=4, max_queue_wait_s=5.0, **pool),),  # type: ignore[arg-type]
        version=1,
    )


async def test_a_pool_whose_backend_breaker_opened_refuses_with_why(aredis, keys, sim) -> None:
    async with running_dispatcher(aredis, keys, config(sim)), Producer(aredis, keys=keys) as producer:
        for _ in range(2):  # the backend fails: the shared breaker opens after two failures
            with pytest.raises(BackendHTTPError):
                await producer.submit({**CALL, "sim": {"status": 503}}, pool_id="p", timeout=10)

        # The breaker's failure was recorded before the reply went out: the state is there now.
        assert decode_state(await aredis.get(keys.backend_breaker("sim"))).mode == OPEN
        with pytest.raises(QueueFull) as caught:
            await producer.submit(CALL, pool_id="p", timeout=10)
    full = caught.value
    assert (full.reason, full.retry_after_s) == ("breaker_open", 5.0)
    assert "circuit breaker open" in str(full) and "unbounded" in str(full)
    assert await aredis.llen(keys.requests("p")) == 0
    assert await aredis.hget(keys.rejections(), "p:breaker_open") == b"1"
    assert producer.stats.rejected == 1


async def test_a_paused_pool_refuses_at_once_instead_of_queueing_for_ever(aredis, keys, sim) -> None:
    await groups.publish(aredis, keys, config(sim, paused=True))
    async with Producer(aredis, keys=keys) as producer:
        with pytest.raises(QueueFull) as caught:
            await producer.submit(CALL, pool_id="p", timeout=10)
    assert caught.value.reason == "paused" and "pool 'p' is paused" in str(caught.value)
    assert await aredis.llen(keys.requests("p")) == 0
    assert await aredis.hget(keys.rejections(), "p:paused") == b"1"
