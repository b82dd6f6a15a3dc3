"""Durable delivery of streamed calls: chunks are fenced like replies, and a stream is run again only
while nothing of it reached the producer. Real dispatcher processes (SIGKILL, SIGSTOP), the real
simulator streaming over HTTP, real Valkey. A graceful shutdown follows the same rule: a durable call
cut off by the grace period goes back to its queue unless chunks of it reached the client."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from runtime.errors import StreamInterrupted
from runtime.producer import Producer
from runtime.queue import groups
from runtime.telemetry import semconv
from runtime.wire.contract import Envelope
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatcher_process import start_dispatcher, stop_dispatcher
from tests.support.dispatching import running_dispatcher, wait_until
from tests.support.durable import LEASE_S, counted, group, keyed

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


class Fleet:
    """Dispatcher processes of group "g" (durable); each is stopped at the end, a frozen one too."""

    def __init__(self, valkey_url: str, prefix: str) -> None:
        self.valkey_url, self.prefix = valkey_url, prefix
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, ident: str) -> subprocess.Popen[str]:
        proc = start_dispatcher(self.valkey_url, self.prefix, "g", ident, concurrency=4, lease_s=LEASE_S)
        self.procs.append(proc)
        return proc


@pytest.fixture
async def fleet(aredis, keys, valkey_url, backend) -> AsyncIterator[Fleet]:
    await groups.publish(aredis, keys, group(backend.url))
    started = Fleet(valkey_url, keys.prefix)
    try:
        yield started
    finally:
        for proc in started.procs:
            proc.send_signal(signal.SIGCONT)
            stop_dispatcher(proc)


def streaming(
    producer: Producer, call: Mapping[str, Any]
) -> tuple[asyncio.Task[None], list[Mapping[str, Any]]]:
    """Reads a streamed call in a task; the chunks land in the list as they arrive."""
    chunks: list[Mapping[str, Any]] = []
    reading = asyncio.create_task(collect(producer.stream(call, pool_id="default", timeout=60), chunks))
    return reading, chunks


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(5)


async def test_sigkill_mid_stream_ends_it_with_stream_interrupted_and_runs_nothing_again(
    aredis, sredis, keys, backend, fleet
) -> None:
    doomed = fleet.start("doomed")
    async with Producer(aredis, keys=keys) as producer:
        reading, chunks = streaming(producer, keyed("st", itl_ms=150, completion_tokens=60))  # ~9 s
        await wait_until(lambda: len(chunks) >= 3, timeout=20, what="the first chunks")
        kill(doomed)
        fleet.start("survivor")
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


async def test_sigkill_before_the_first_chunk_requeues_the_stream_and_it_completes_once(
    aredis, sredis, keys, backend, fleet
) -> None:
    doomed = fleet.start("doomed")
    async with Producer(aredis, keys=keys) as producer:
        reading, chunks = streaming(producer, keyed("early", ttft_ms=4000, itl_ms=5, completion_tokens=8))
        await wait_until(lambda: backend.calls_by_key.get("early") == 1, timeout=20, what="the call")
        kill(doomed)
        fleet.start("survivor")
        await reading
    assert roles(chunks) == 1 and chunks[-1]["choices"][0]["finish_reason"]
    assert backend.calls_by_key == {"early": 2}
    await wait_until(lambda: counted(sredis, keys, "requeued") == 1, timeout=10, what="one requeue")


async def test_a_dispatcher_frozen_mid_stream_relays_nothing_once_its_lease_is_gone(
    aredis, sredis, keys, backend, fleet
) -> None:
    frozen = fleet.start("frozen")
    async with Producer(aredis, keys=keys) as producer:
        reading, chunks = streaming(producer, keyed("fz", itl_ms=100, completion_tokens=60))
        await wait_until(lambda: len(chunks) >= 3, timeout=20, what="the first chunks")
        frozen.send_signal(signal.SIGSTOP)
        fleet.start("reaper")
        with pytest.raises(StreamInterrupted):
            await reading
        seen = len(chunks)
        frozen.send_signal(signal.SIGCONT)  # it resumes relaying: its next chunk is refused
        await wait_until(
            lambda: counted(sredis, keys, "dropped:stale_attempt") == 1, timeout=20, what="a stale attempt"
        )
        assert len(chunks) == seen and roles(chunks) == 1
        assert await aredis.llen(keys.replies(producer.producer_id)) == 0
    assert backend.calls_by_key == {"fz": 1}


async def test_a_graceful_shutdown_requeues_the_durable_calls_it_cannot_finish(
    aredis, keys, backend, spans
) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("llm_dispatch.dispatcher")
    async with Producer(aredis, keys=keys) as producer:
        call = asyncio.create_task(
            producer.submit(keyed("long", latency_ms=1500), pool_id="default", timeout=60)
        )
        async with running_dispatcher(
            aredis, keys, group(backend.url), tracer=tracer, shutdown_grace_s=0.2
        ) as first:
            await wait_until(lambda: backend.calls_by_key.get("long") == 1, timeout=20, what="the call")
        # The grace period ended before the call did: it went back to the head of its pool, unanswered.
        assert not call.done() and first.stats.requeued == 1
        [queued] = await aredis.lrange(keys.requests("default"), 0, -1)
        assert (Envelope.decode(queued).attempt, Envelope.decode(queued).requeues) == (2, 1)
        async with running_dispatcher(aredis, keys, group(backend.url)):
            result = await call
        assert result.completion["choices"] and backend.calls_by_key == {"long": 2}
    [span] = [
        s for s in exporter.get_finished_spans() if s.attributes.get("llm_dispatch.status") == "requeued"
    ]
    assert "shut down" in str(span.attributes[semconv.ERROR_MESSAGE])


async def test_a_graceful_shutdown_ends_a_stream_that_sent_chunks_as_stream_interrupted(
    aredis, keys, backend
) -> None:
    async with Producer(aredis, keys=keys) as producer:
        reading, chunks = streaming(producer, keyed("sd", itl_ms=100, completion_tokens=60))
        async with running_dispatcher(aredis, keys, group(backend.url), shutdown_grace_s=0.2) as first:
            await wait_until(lambda: len(chunks) >= 2, timeout=20, what="the first chunks")
        with pytest.raises(StreamInterrupted):
            await reading
        assert first.stats.requeued == 0 and first.stats.failed["stream_interrupted"] == 1
        assert await aredis.llen(keys.requests("default")) == 0 and backend.calls_by_key == {"sd": 1}
