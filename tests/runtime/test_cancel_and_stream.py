"""Cancellation and streaming inside one event loop: a real dispatcher, the real simulator over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from runtime.backends.adapter import OpenAIBackend
from runtime.errors import Cancelled
from runtime.producer import Producer
from runtime.queue.keys import KeySpace
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatching import running_dispatcher

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
