"""A live producer whose liveness marker lapsed while its call waited in the queue: the dispatcher drops
the call as ``producer_gone`` (never run, counted as before) and tells the producer, whose caller gets
a typed, retryable :class:`ProducerGone` at once instead of waiting out its timeout."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from ingress.errors import api_error_for
from runtime.config import ProducerSettings
from runtime.dispatch.stats import DROP_PRODUCER_GONE, DROP_REPLY_PRODUCER_GONE
from runtime.errors import DispatchError, ProducerGone
from runtime.producer import Producer
from runtime.telemetry import semconv
from runtime.wire.groupconfig import DURABLE, PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatching import CALL, one_pool_group, running_dispatcher, wait_until

TIMEOUT_S = 30.0
# The marker's refresh a minute away: once deleted, it stays missing while the test runs.
STALLED = ProducerSettings(alive_ttl_s=120.0, alive_refresh_s=60.0)


@pytest.mark.parametrize("mode", ["lists", "durable", "fair"])
async def test_a_call_dropped_while_the_marker_lapsed_fails_at_once_with_producer_gone(
    aredis, keys, spans, mode: str
) -> None:
    provider, exporter = spans
    async with SimulatorServer(SimulatorConfig()) as sim:
        config = one_pool_group(sim.url)
        tenant = None
        if mode == "durable":
            config = dataclasses.replace(config, delivery=DURABLE)
        if mode == "fair":
            config = dataclasses.replace(config, pools=(PoolConfig("default", tenant_fairness="tokens"),))
            tenant = "key-7"
        async with Producer(aredis, keys=keys, settings=STALLED) as producer:
            # Published first (the producer reads its pools), run only once the marker is gone.
            async with running_dispatcher(aredis, keys, config):
                pass
            started = time.monotonic()
            call = asyncio.create_task(
                producer.submit(CALL, pool_id="default", timeout=TIMEOUT_S, tenant=tenant)
            )
            backlog = keys.tenant_requests("default", tenant) if tenant else keys.requests("default")
            await wait_until(lambda: aredis.llen(backlog), timeout=5)
            await aredis.delete(keys.producer_alive(producer.producer_id))
            async with running_dispatcher(
                aredis, keys, config, tracer=provider.get_tracer("d")
            ) as dispatcher:
                with pytest.raises(ProducerGone) as caught:
                    await asyncio.wait_for(call, TIMEOUT_S)
                assert dispatcher.stats.dropped[DROP_PRODUCER_GONE] == 1
        # History says what the caller was told.
        [span] = [s for s in exporter.get_finished_spans() if s.attributes.get(semconv.DROP_REASON)]
        assert span.attributes[semconv.DROP_REASON] == DROP_PRODUCER_GONE
        assert span.attributes[semconv.ERROR_TYPE] == ProducerGone.error_type
        assert time.monotonic() - started < 10, "answered well before the caller's timeout"
        assert sim.completions_requested == 0
        assert caught.value.retryable and "liveness marker had lapsed" in str(caught.value)
        api = api_error_for(caught.value)
        assert (api.status, api.type, api.code) == (503, "service_unavailable", "producer_gone")
        assert producer.producer_id not in api.message
        assert await aredis.hget(keys.counters("g"), f"dropped:{DROP_PRODUCER_GONE}") == b"1"
        # Its reply list expires as any does, for a producer that never comes back.
        ttl = await aredis.pttl(keys.replies(producer.producer_id))
        assert ttl == -2 or ttl > 0


async def test_a_streamed_call_dropped_while_the_marker_lapsed_fails_at_once_with_producer_gone(
    aredis, keys
) -> None:
    async with SimulatorServer(SimulatorConfig()) as sim:
        config = one_pool_group(sim.url)
        async with Producer(aredis, keys=keys, settings=STALLED) as producer:
            async with running_dispatcher(aredis, keys, config):
                pass
            started = time.monotonic()

            async def consume() -> list[object]:
                return [chunk async for chunk in producer.stream(CALL, pool_id="default", timeout=TIMEOUT_S)]

            call = asyncio.create_task(consume())
            await wait_until(lambda: aredis.llen(keys.requests("default")), timeout=5)
            await aredis.delete(keys.producer_alive(producer.producer_id))
            async with running_dispatcher(aredis, keys, config):
                with pytest.raises(ProducerGone):
                    await asyncio.wait_for(call, TIMEOUT_S)
        assert time.monotonic() - started < 10
        assert sim.completions_requested == 0


async def test_a_stream_cut_because_the_marker_lapsed_mid_stream_ends_at_once_with_its_error(
    aredis, keys
) -> None:
    """The marker lapses after the first chunk: the relay stops and the backend call is cut off
    (``stream_producer_gone``), and the producer, alive after all, is told so instead of waiting out its
    timeout for chunks that will never come."""
    async with SimulatorServer(SimulatorConfig()) as sim:
        config = one_pool_group(sim.url)
        long_stream = {**CALL, "sim": {"itl_ms": 100, "completion_tokens": 200}}  # ~20 s of chunks
        async with (
            Producer(aredis, keys=keys, settings=STALLED) as producer,
            running_dispatcher(aredis, keys, config) as dispatcher,
        ):
            chunks = 0
            started = time.monotonic()
            with pytest.raises(DispatchError) as caught:
                async for _ in producer.stream(long_stream, pool_id="default", timeout=TIMEOUT_S):
                    chunks += 1
                    if chunks == 1:
                        await aredis.delete(keys.producer_alive(producer.producer_id))
            assert time.monotonic() - started < 10, "ended well before the stream or the timeout would"
            assert caught.value.error_type == "stream_producer_gone"
            assert "liveness" in str(caught.value) and producer.producer_id not in str(caught.value)
            assert 1 <= chunks < 100
            await wait_until(lambda: dispatcher.stats.failed["stream_producer_gone"] == 1, timeout=5)
            assert dispatcher.stats.dropped[DROP_REPLY_PRODUCER_GONE] == 1
        ttl = await aredis.pttl(keys.replies(producer.producer_id))
        assert ttl == -2 or ttl > 0
