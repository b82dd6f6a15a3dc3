"""history_migrate brings a database of the previous layout forward (real chDB)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from history import queries, schema
from history.client import HistoryClient, client_for, close_all
from history.ingester import span_row
from tests.support.history_spans import execution_doc
from tests.support.legacy_history_schema import legacy_create_table_sql


@pytest.fixture
def legacy(ch_url: str) -> Iterator[HistoryClient]:
    """A database as the previous version left it: the old table, with a batch stored twice."""
    client = client_for(ch_url)
    client.command(f"CREATE DATABASE IF NOT EXISTS `{client.database}`")
    client.command(legacy_create_table_sql(client.database, 30))
    docs = [
        execution_doc(request_id="legacy-new", pool="a", ago_s=30),
        execution_doc(
            request_id="legacy-old", pool="b", status="error", error_type="timeout", ago_s=5 * 86400
        ),
    ]
    rows = [span_row(d) for d in docs]
    for _ in range(2):  # the old ingester's crash between insert and ack
        client.insert(schema.TABLE, rows, schema.INSERT_COLUMNS)
    yield client
    close_all()


def _count(client: HistoryClient, table: str) -> int:
    return int(client.query(f"SELECT count() AS n FROM {schema.table_name(client, table)}")[0]["n"])


def test_migrate_brings_an_old_database_forward_once(legacy: HistoryClient) -> None:
    for _ in range(2):  # idempotent: the second run neither fails nor fills the new tables again
        schema.migrate(legacy, retention_days=30)
    assert _count(legacy, schema.TABLE) == 2  # the old duplicates collapsed once
    assert _count(legacy, schema.EXECUTIONS) == 2 and _count(legacy, schema.REQUEST_IDS) == 2
    old = queries.execution_detail(client=legacy, request_id="legacy-old")
    assert old is not None and old["execution"]["error_type"] == "timeout"
    now = datetime.now(UTC)
    stats = {
        s.pool: s for s in queries.pool_analytics(client=legacy, since=now - timedelta(days=7), until=now)
    }
    assert (stats["a"].count, stats["b"].errors) == (1, 1)


def test_an_old_table_deduplicates_new_batches(legacy: HistoryClient) -> None:
    schema.migrate(legacy, retention_days=30)
    rows = [span_row(execution_doc(request_id="after"))]
    for _ in range(2):
        legacy.insert(schema.TABLE, rows, schema.INSERT_COLUMNS, dedup_token="batch-1")
    assert _count(legacy, schema.TABLE) == 3 and _count(legacy, schema.EXECUTIONS) == 3
