"""A real dispatch through the simulator ends up as span rows in ClickHouse, one trace per request."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import redis
import redis.asyncio as aioredis
from opentelemetry.sdk.trace import TracerProvider

from history import queries
from history.client import HistoryClient
from history.ingester import Ingester
from runtime.config import DispatcherSettings
from runtime.dispatch.dispatcher import Dispatcher
from runtime.producer import Producer
from runtime.queue import groups
from runtime.queue.keys import KeySpace
from runtime.telemetry.tracing import configure_tracing, shutdown_tracing
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatching import CALL, one_pool_group, wait_until
from tests.support.history_spans import drain


@pytest.fixture
def producer_provider(valkey_url: str, keys: KeySpace) -> Iterator[TracerProvider]:
    tp = configure_tracing(
        redis_url=valkey_url,
        keys=keys,
        service_name="llm-dispatch-producer",
        install_global=False,
        schedule_delay_millis=20,
    )
    yield tp
    shutdown_tracing(tp, 2.0)


async def test_dispatch_to_clickhouse(
    aredis: aioredis.Redis,
    sredis: redis.Redis,
    keys: KeySpace,
    history: HistoryClient,
    provider: TracerProvider,
    producer_provider: TracerProvider,
) -> None:
    async with SimulatorServer(SimulatorConfig()) as sim:
        backend = sim.url.replace("://", "://operator:sup3rsecret@", 1)
        config = one_pool_group(backend, group_id="g-e2e", pool_id="interactive")
        await groups.publish(aredis, keys, config)
        settings = DispatcherSettings(group_id="g-e2e", shutdown_grace_s=10.0)
        dispatcher = Dispatcher(
            aredis, settings, keys=keys, tracer=provider.get_tracer("llm_dispatch.dispatcher")
        )
        task = asyncio.create_task(dispatcher.run(install_signal_handlers=False))
        try:
            await wait_until(lambda: dispatcher.config is not None or task.done())
            tracer = producer_provider.get_tracer("llm_dispatch.producer")
            async with Producer(aredis, keys=keys, tracer=tracer) as producer:
                results = [await producer.submit(CALL, pool_id="interactive", timeout=10) for _ in range(3)]
        finally:
            dispatcher.request_stop()
            await asyncio.wait_for(task, 30)
    provider.force_flush()
    producer_provider.force_flush()
    assert drain(Ingester(sredis, history, keys=keys, block_ms=50)) == 6

    for result in results:
        detail = queries.execution_detail(client=history, request_id=result.request_id)
        assert detail is not None
        ex = detail["execution"]
        assert (ex["group"], ex["pool"], ex["status"], ex["model"]) == (
            "g-e2e",
            "interactive",
            "ok",
            "sim-model",
        )
        assert ex["producer"] == producer.producer_id and ex["dispatcher"]
        assert ex["queue_wait_s"] is not None and ex["execution_s"] > 0 and ex["total_s"] >= ex["execution_s"]
        assert ex["input_tokens"] and ex["output_tokens"]
        assert {s["service"] for s in detail["trace"]} == {"llm-dispatch-producer", "llm-dispatch-dispatcher"}
        assert len(detail["trace"]) == 2
    text = "\n".join(
        r["r"] for r in history.query("SELECT formatRow('JSONEachRow', *) AS r FROM otel.otel_traces")
    )
    assert "sup3rsecret" not in text and "operator" not in text
    assert urlsplit(sim.url).netloc in text  # the backend address is stored, without credentials
