"""Fixtures shared by the runtime tests: the simulator over real HTTP and an in-memory span exporter."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from simulator.server import SimulatorConfig, SimulatorServer
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
