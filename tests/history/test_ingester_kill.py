"""SIGKILL a real ingester process mid-pipeline (one batch inserted, the next read ahead, neither
acknowledged): a restarted ingester stores every span exactly once, in every table."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import orjson
import pytest
import redis

from history import schema
from history.client import HistoryClient, client_for, close_all
from history.ingester import GROUP, Ingester
from runtime.queue.keys import KeySpace
from tests.support.history_spans import drain, execution_doc
from tests.support.ingester_process import held_key, start_ingester
from tests.support.waiting import wait_until_sync

BATCH = 100


@pytest.fixture
def reopen(ch_url: str) -> Iterator[None]:
    yield
    close_all()


def _export(sredis: redis.Redis, keys: KeySpace, count: int) -> None:
    pipe = sredis.pipeline(transaction=False)
    for i in range(count):
        pipe.xadd(keys.span_stream(), {"span": orjson.dumps(execution_doc(request_id=f"r{i}"))})
    pipe.execute()


def _kill(proc) -> None:  # type: ignore[no-untyped-def]
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL


def _count(history: HistoryClient, table: str, what: str = "count()") -> int:
    return int(history.query(f"SELECT {what} AS n FROM {schema.table_name(history, table)}")[0]["n"])


def _assert_each_stored_once(history: HistoryClient, count: int) -> None:
    assert _count(history, schema.TABLE, "uniqExact(RequestId)") == count
    for table in (schema.TABLE, schema.EXECUTIONS, schema.REQUEST_IDS):
        assert _count(history, table) == count, table
    for table in (schema.POOL_MINUTES, schema.POOL_HOURS):
        assert _count(history, table, "sum(Executions)") == count, table


@pytest.mark.slow
def test_killed_between_insert_and_ack_with_a_batch_read_ahead(
    valkey_url: str, sredis: redis.Redis, keys: KeySpace, ch_url: str, reopen: None
) -> None:
    _export(sredis, keys, 3 * BATCH + BATCH // 2)
    proc = start_ingester(valkey_url, keys.prefix, ch_url, BATCH, hold_at=2)
    try:
        wait_until_sync(
            lambda: sredis.exists(held_key(keys.prefix)), 90, what="the ingester held mid-pipeline"
        )
        # Batch 1 acknowledged; batch 2 inserted, batch 3 read ahead while it was: both still pending.
        assert sredis.xpending(keys.span_stream(), GROUP)["pending"] == 2 * BATCH
    finally:
        _kill(proc)
    history = client_for(ch_url)
    assert _count(history, schema.TABLE) == 2 * BATCH  # batch 2 was stored: its second insert must not be
    restarted = Ingester(sredis, history, keys=keys, block_ms=50, batch_size=BATCH)
    assert drain(restarted) == 2 * BATCH + BATCH // 2
    assert restarted.stats.redelivered == 2 * BATCH
    _assert_each_stored_once(history, 3 * BATCH + BATCH // 2)
    assert sredis.xpending(keys.span_stream(), GROUP)["pending"] == 0


@pytest.mark.slow
def test_killed_at_an_arbitrary_moment_of_a_backlog_drain(
    valkey_url: str, sredis: redis.Redis, keys: KeySpace, ch_url: str, reopen: None
) -> None:
    """No hook: the kill lands wherever the pipeline is (reading ahead, inserting, acknowledging)."""
    total = 30 * BATCH
    _export(sredis, keys, total)

    def entries_read() -> int:
        groups = sredis.xinfo_groups(keys.span_stream())
        return int(groups[0]["entries-read"] or 0) if groups else 0

    proc = start_ingester(valkey_url, keys.prefix, ch_url, BATCH)
    try:
        wait_until_sync(lambda: entries_read() >= 10 * BATCH, 90, interval=0.005, what="a third read")
    finally:
        _kill(proc)
    assert entries_read() < total, "the ingester finished before the kill: nothing was raced"
    history = client_for(ch_url)
    restarted = Ingester(sredis, history, keys=keys, block_ms=50, batch_size=BATCH)
    drain(restarted, rounds=100)
    _assert_each_stored_once(history, total)
    assert sredis.xpending(keys.span_stream(), GROUP)["pending"] == 0
