"""Cancellation and streaming inside one event loop: a real dispatcher, the real simulator over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from runtime.backends.adapter import OpenAIBackend
from runtime.errors import Cancelled, DispatchError
from runtime.producer import Producer
from runtime.queue.keys import KeySpace
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatching import running_dispatcher
from tests.support.waiting import wait_until

CALL = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def sim() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(SimulatorConfig()) as server:
        yield server


def config(url: str) -> GroupConfig:
    return GroupConfig(
        group_id="g", policy="fifo", total_concurrency=4, default_endpoint_url=url,
        pools=(PoolConfig("p", max_concurrent=4),), version=1,
    )  # fmt: skip


async def test_a_cancel_heard_before_the_call_starts_still_cancels_it(
    aredis: aioredis.Redis, keys: KeySpace, sim: SimulatorServer
) -> None:
    async with running_dispatcher(aredis, keys, config(sim.url)) as dispatcher:
        assert dispatcher.executor.cancel("early") is False  # nothing runs yet: remembered
        async with Producer(aredis, keys=keys) as producer:
            with pytest.raises(Cancelled, match="before its call started"):
                await producer.submit(CALL, pool_id="p", request_id="early", timeout=10)
            assert (await producer.submit(CALL, pool_id="p", timeout=10)).completion["choices"]
    assert sim.completions_total == 1  # only the second call reached the backend


async def test_the_direct_path_streams_too(sim: SimulatorServer) -> None:
    backend = OpenAIBackend(sim.url)
    async with Producer(None, direct_backend=backend) as producer:  # type: ignore[arg-type]
        chunks = [
            c
            async for c in producer.stream(
                {**CALL, "max_tokens": 4, "stream": True}, pool_id="p", include_usage=True
            )
        ]
    await backend.aclose()
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


async def test_a_call_withdrawn_while_it_runs_is_cut_off_and_the_dispatcher_goes_on(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    """The call runs in its execute task (no task of its own): the producer's cancel cuts it off as
    ``cancelled``, the task stays usable (its FINISH and the next call run), and nothing is left
    cancelling it."""
    async with (
        SimulatorServer(SimulatorConfig(latency_ms=20_000)) as slow,
        running_dispatcher(aredis, keys, config(slow.url)) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        running = asyncio.create_task(producer.submit(CALL, pool_id="p", request_id="long", timeout=60))
        await wait_until(lambda: "long" in dispatcher.executor._calls, timeout=10)
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await wait_until(lambda: dispatcher.stats.failed["cancelled"] == 1, timeout=5)
        assert not dispatcher.running and not dispatcher.executor._withdrawn
        assert await aredis.zcard(keys.pool_inflight("p")) == 0
        assert dispatcher.stats.completed == 0


async def test_a_shutdown_cuts_a_running_call_as_a_shutdown_not_as_a_withdrawal(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    async with (
        SimulatorServer(SimulatorConfig(latency_ms=20_000)) as slow,
        Producer(aredis, keys=keys) as producer,
    ):
        async with running_dispatcher(aredis, keys, config(slow.url), shutdown_grace_s=0.2) as dispatcher:
            running = asyncio.create_task(producer.submit(CALL, pool_id="p", request_id="long", timeout=60))
            await wait_until(lambda: "long" in dispatcher.executor._calls, timeout=10)
        with pytest.raises(DispatchError) as cut:
            await running
    assert not isinstance(cut.value, Cancelled)
    assert dispatcher.stats.failed["cancelled"] == 0 and sum(dispatcher.stats.failed.values()) == 1
