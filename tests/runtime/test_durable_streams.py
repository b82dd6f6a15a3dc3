"""Durable delivery of streamed calls: chunks are fenced like replies, and a stream is run again only
while nothing of it reached the producer. Real dispatcher processes (SIGKILL, SIGSTOP), the real
simulator streaming over HTTP, real Valkey."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from runtime.errors import StreamInterrupted
from runtime.producer import Producer
from runtime.wire import groupconfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.runtime.dispatcher_proc import start_dispatcher, stop_dispatcher
from tests.runtime.harness import wait_until
from tests.runtime.test_durable import LEASE_S, counted, group, keyed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
async def backend() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(SimulatorConfig()) as server:
        yield server


async def collect(stream: Any, into: list[Mapping[str, Any]]) -> None:
    async for chunk in stream:
        into.append(chunk)


def roles(chunks: list[Mapping[str, Any]]) -> int:
    """How many chunks open an assistant message: one per attempt the client saw."""
    return sum(1 for c in chunks for ch in c.get("choices") or () if ch.get("delta", {}).get("role"))


async def test_sigkill_mid_stream_ends_it_with_stream_interrupted_and_runs_nothing_again(
    aredis, sredis, keys, valkey_url, backend
) -> None:
    await groupconfig.publish(aredis, keys, group(backend.url))
    doomed = start_dispatcher(valkey_url, keys.prefix, "g", "doomed", concurrency=4, lease_s=LEASE_S)
    survivor = None
    try:
        async with Producer(aredis, keys=keys) as producer:
            chunks: list[Mapping[str, Any]] = []
            call = keyed("st", itl_ms=150, completion_tokens=60)  # ~9 s of tokens
            reading = asyncio.create_task(
                collect(producer.stream(call, pool_id="default", timeout=60), chunks)
            )
            await wait_until(lambda: len(chunks) >= 3, timeout=20, what="the first chunks")
            doomed.send_signal(signal.SIGKILL)
            doomed.wait(5)
            survivor = start_dispatcher(
                valkey_url, keys.prefix, "g", "survivor", concurrency=4, lease_s=LEASE_S
            )
            with pytest.raises(StreamInterrupted):
                await reading
            assert roles(chunks) == 1 and len({c["id"] for c in chunks}) == 1  # one attempt, never mixed
            assert producer.stats.duplicate_replies == 0
        assert backend.calls_by_key == {"st": 1}  # not run again: the client already held chunks
        await wait_until(
            lambda: counted(sredis, keys, "failed:stream_interrupted") == 1, timeout=10, what="counted"
        )
        assert counted(sredis, keys, "requeued") == 0
        assert await aredis.llen(keys.requests("default")) == 0
    finally:
        for proc in (doomed, survivor):
            if proc is not None:
                stop_dispatcher(proc)


async def test_sigkill_before_the_first_chunk_requeues_the_stream_and_it_completes_once(
    aredis, sredis, keys, valkey_url, backend
) -> None:
    await groupconfig.publish(aredis, keys, group(backend.url))
    doomed = start_dispatcher(valkey_url, keys.prefix, "g", "doomed", concurrency=4, lease_s=LEASE_S)
    survivor = None
    try:
        async with Producer(aredis, keys=keys) as producer:
            chunks: list[Mapping[str, Any]] = []
            call = keyed("early", ttft_ms=4000, itl_ms=5, completion_tokens=8)
            reading = asyncio.create_task(
                collect(producer.stream(call, pool_id="default", timeout=60), chunks)
            )
            await wait_until(lambda: backend.calls_by_key.get("early") == 1, timeout=20, what="the call")
            doomed.send_signal(signal.SIGKILL)
            doomed.wait(5)
            survivor = start_dispatcher(
                valkey_url, keys.prefix, "g", "survivor", concurrency=4, lease_s=LEASE_S
            )
            await reading
        assert roles(chunks) == 1 and chunks[-1]["choices"][0]["finish_reason"]
        assert backend.calls_by_key == {"early": 2}
        await wait_until(lambda: counted(sredis, keys, "requeued") == 1, timeout=10, what="one requeue")
    finally:
        for proc in (doomed, survivor):
            if proc is not None:
                stop_dispatcher(proc)


async def test_a_dispatcher_frozen_mid_stream_relays_nothing_once_its_lease_is_gone(
    aredis, sredis, keys, valkey_url, backend
) -> None:
    await groupconfig.publish(aredis, keys, group(backend.url))
    frozen = start_dispatcher(valkey_url, keys.prefix, "g", "frozen", concurrency=4, lease_s=LEASE_S)
    reaper = None
    try:
        async with Producer(aredis, keys=keys) as producer:
            chunks: list[Mapping[str, Any]] = []
            call = keyed("fz", itl_ms=100, completion_tokens=60)
            reading = asyncio.create_task(
                collect(producer.stream(call, pool_id="default", timeout=60), chunks)
            )
            await wait_until(lambda: len(chunks) >= 3, timeout=20, what="the first chunks")
            frozen.send_signal(signal.SIGSTOP)
            reaper = start_dispatcher(valkey_url, keys.prefix, "g", "reaper", concurrency=4, lease_s=LEASE_S)
            with pytest.raises(StreamInterrupted):
                await reading
            seen = len(chunks)
            frozen.send_signal(signal.SIGCONT)  # it resumes relaying: its next chunk is refused
            await wait_until(
                lambda: counted(sredis, keys, "dropped:stale_attempt") == 1,
                timeout=20,
                what="a stale attempt",
            )
            assert len(chunks) == seen and roles(chunks) == 1
            assert await aredis.llen(keys.replies(producer.producer_id)) == 0
        assert backend.calls_by_key == {"fz": 1}
    finally:
        for proc in (frozen, reaper):
            if proc is not None:
                proc.send_signal(signal.SIGCONT)
                stop_dispatcher(proc)
