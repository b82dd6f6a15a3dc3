"""Fixtures shared by the runtime tests: the simulator over real HTTP, an in-memory span exporter, and a
producer on either path (queued through a real dispatcher, or direct to the simulator)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runtime.backends.adapter import OpenAIBackend
from runtime.producer import Producer
from runtime.queue.keys import KeySpace
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatching import one_pool_group, running_dispatcher
from tests.support.sentinel_cluster import sentinel_cluster  # noqa: F401 - a primary, a replica, three sentinels


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """The real OpenTelemetry SDK with an in-memory exporter: tests read the spans a dispatch made."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture
async def sim() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(SimulatorConfig()) as server:
        yield server


@pytest.fixture(params=["queued", "direct"])
async def producer(
    request: pytest.FixtureRequest, aredis: aioredis.Redis, keys: KeySpace, sim: SimulatorServer
) -> AsyncIterator[Producer]:
    """A producer whose calls go through the queue and a real dispatcher, or straight to the backend:
    a test that asks for ``producer`` runs on both paths (a module may define its own ``producer``)."""
    if request.param == "queued":
        async with (
            running_dispatcher(aredis, keys, one_pool_group(sim.url)),
            Producer(aredis, keys=keys) as p,
        ):
            yield p
        return
    backend = OpenAIBackend(sim.url)
    async with Producer(None, direct_backend=backend) as p:  # type: ignore[arg-type]
        yield p
    await backend.aclose()
