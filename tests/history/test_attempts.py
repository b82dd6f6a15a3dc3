"""Retries in history: the attempt chain with its waits; retry rate, requeues, dead letters."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from history import queries
from history.client import HistoryClient
from tests.support.history_spans import execution_doc, store

T0 = time.time_ns() - 120 * 10**9


def chain_docs() -> list[dict]:
    """503, 503, then ok; every span starts at the request's enqueue time, as the dispatcher writes them."""
    common = {"request_id": "r-3", "pool": "p", "trace_id": "ab" * 16, "start_ns": T0}
    first = execution_doc(
        status="retry", error_type="backend_http_error", attempt=1, queue_wait=0.5, execution=0.2, **common
    )
    second = execution_doc(
        status="retry", error_type="backend_http_error", attempt=2, queue_wait=1.7, execution=0.2, **common
    )
    third = execution_doc(status="ok", attempt=3, queue_wait=3.9, execution=0.3, **common)
    return [third, first, second]  # stored out of order


def test_detail_orders_attempts_with_their_waits(history: HistoryClient) -> None:
    store(history, chain_docs())
    detail = queries.execution_detail(client=history, request_id="r-3")
    assert detail is not None
    chain = detail["attempts"]
    assert [(a["attempt"], a["status"], a["error_type"]) for a in chain] == [
        (1, "retry", "backend_http_error"),
        (2, "retry", "backend_http_error"),
        (3, "ok", ""),
    ]
    assert [a["wait_s"] for a in chain] == pytest.approx([0.5, 1.0, 2.0])
    assert chain[0]["error_message"] == "backend_http_error happened"
    assert detail["execution"]["attempt"] == 3  # the final outcome is the last attempt


def test_spans_without_an_attempt_count_as_the_first(history: HistoryClient) -> None:
    store(history, [execution_doc(request_id="old")])
    detail = queries.execution_detail(client=history, request_id="old")
    assert detail is not None and detail["execution"]["attempt"] == 1


def test_pool_analytics_count_retries_requeues_and_dead_letters(history: HistoryClient) -> None:
    docs = chain_docs()
    docs += [execution_doc(pool="p", status="requeued", attempt=1)]
    docs += [execution_doc(pool="p", status="error", error_type="dead_lettered", attempt=2)]
    docs += [execution_doc(pool="p", status="ok")]
    store(history, docs)
    now = datetime.now(UTC)
    (stats,) = queries.pool_analytics(client=history, since=now - timedelta(hours=1), until=now)
    assert (stats.retries, stats.requeues, stats.dead_letters) == (2, 1, 1)
    assert (stats.ok, stats.errors) == (2, 1)
    assert stats.retry_rate == pytest.approx(2 / 5)


@pytest.mark.django_db
def test_detail_page_shows_the_chain(
    history: HistoryClient, ch_url: str, admin_client: Client, settings
) -> None:
    settings.CLICKHOUSE_URL = ch_url
    store(history, chain_docs())
    html = admin_client.get("/history/request/r-3/").content.decode()
    assert html.count('<tr class="attempt">') == 3
    assert "backend_http_error happened" in html


def test_migrate_adds_the_attempt_column_to_an_older_table(history: HistoryClient) -> None:
    from history import schema

    history.command(f"ALTER TABLE {schema.table_name(history)} DROP COLUMN Attempt")
    store(history, [execution_doc(request_id="before", attempt=2)])
    schema.migrate(history, retention_days=30)
    detail = queries.execution_detail(client=history, request_id="before")
    assert detail is not None and detail["execution"]["attempt"] == 2


@pytest.mark.django_db
def test_pool_analytics_page_shows_retry_rate_requeues_and_dead_letters(
    history: HistoryClient, ch_url: str, admin_client: Client, settings, monkeypatch
) -> None:
    from pools import connections

    settings.CLICKHOUSE_URL = ch_url
    monkeypatch.setattr(connections, "valkey_url", lambda: "redis://127.0.0.1:1/0")  # no stream box
    docs = [*chain_docs(), execution_doc(pool="p", status="requeued", attempt=1)]
    docs += [execution_doc(pool="p", status="error", error_type="dead_lettered", attempt=2)]
    store(history, docs)
    html = admin_client.get("/history/pools/?window=1h").content.decode()
    # 2 retries of 4 backend attempts (1 ok, 1 error, 2 retries).
    assert "retries 50.0%<br>1 requeued<br>1 dead" in html
