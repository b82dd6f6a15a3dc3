"""History fixtures: a real chDB database per test, and a tracer provider exporting to a real stream."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from opentelemetry.sdk.trace import TracerProvider

from history import schema
from history.client import HistoryClient, client_for, close_all
from history.ingester import Ingester
from runtime.queue.keys import KeySpace
from runtime.telemetry.tracing import configure_tracing, shutdown_tracing


@pytest.fixture
def ch_url(tmp_path: Path) -> str:
    return f"chdb://{tmp_path / 'clickhouse'}"


@pytest.fixture
def history(ch_url: str) -> Iterator[HistoryClient]:
    """A migrated embedded ClickHouse of this test's own (one chDB engine per process: closed after)."""
    client = client_for(ch_url)
    schema.migrate(client, retention_days=30)
    yield client
    close_all()


@pytest.fixture
def provider(valkey_url: str, keys: KeySpace) -> Iterator[TracerProvider]:
    tp = configure_tracing(
        redis_url=valkey_url,
        keys=keys,
        service_name="llm-dispatch-dispatcher",
        schedule_delay_millis=20,
        install_global=False,
    )
    yield tp
    shutdown_tracing(tp, 2.0)


@pytest.fixture
def ingester(sredis: redis.Redis, history: HistoryClient, keys: KeySpace) -> Ingester:
    return Ingester(sredis, history, keys=keys, block_ms=50, batch_size=100)
