"""The management commands and the background runner, as real processes and threads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from django.core.management import call_command
from opentelemetry.sdk.trace import TracerProvider

from history import ingester as ingester_mod
from history import schema
from history.client import HistoryUnavailable, client_for, close_all
from history.ingester import GROUP
from runtime.queue.keys import KeySpace
from tests.support.waiting import wait_for_start, wait_until_sync

ROOT = Path(__file__).resolve().parents[2]


def _runhistory(valkey_url: str, keys: KeySpace, ch_url: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "VALKEY_URL": valkey_url,
        "DISPATCH_KEY_PREFIX": keys.prefix,
        "CLICKHOUSE_URL": ch_url,
    }
    return subprocess.Popen(
        [sys.executable, "manage.py", "runhistory", "--batch-size", "25", "--consumer", "ing-1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _entries_read(sredis: redis.Redis, keys: KeySpace) -> int:
    try:
        groups = sredis.xinfo_groups(keys.span_stream())
    except redis.ResponseError:
        return 0
    return sum(int(g.get("entries-read") or 0) for g in groups)


def _read_since(sredis: redis.Redis, keys: KeySpace, consumer: str, since: float) -> bool:
    """Whether ``consumer`` tried a read of the group after ``since`` (time.monotonic()): its ``idle``
    is the time since its last read attempt."""
    try:
        consumers = sredis.xinfo_consumers(keys.span_stream(), GROUP)
    except redis.ResponseError:  # no group yet
        return False
    idle_ms = next((int(c["idle"]) for c in consumers if c["name"] == consumer.encode()), None)
    return idle_ms is not None and idle_ms < (time.monotonic() - since) * 1000


@pytest.mark.slow
def test_runhistory_killed_mid_stream_loses_and_duplicates_nothing(
    provider: TracerProvider, sredis: redis.Redis, keys: KeySpace, valkey_url: str, ch_url: str
) -> None:
    tracer = provider.get_tracer("t")
    for i in range(400):
        tracer.start_span(f"chat {i % 3}", attributes={"llm_dispatch.request_id": f"r{i}"}).end()
    provider.force_flush()
    first = _runhistory(valkey_url, keys, ch_url)
    try:
        # Its start-up (Django, chDB, the schema) is not what this test times: it waits for the read.
        wait_for_start(lambda: _entries_read(sredis, keys) > 0, first, what="the first ingester reading")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        first.kill()
    killed_at = time.monotonic()
    second = _runhistory(valkey_url, keys, ch_url)
    try:
        # Ready once it reads the group as ing-1 (its predecessor's pending entries first): the drain's
        # deadline starts there, not at a start-up that takes tens of seconds on a busy machine.
        wait_for_start(
            lambda: _read_since(sredis, keys, "ing-1", killed_at), second, what="the second ingester"
        )
        wait_until_sync(
            lambda: (
                sredis.xlen(keys.span_stream()) == 0
                and sredis.xpending(keys.span_stream(), GROUP)["pending"] == 0
            ),
            30,
            what="the second ingester draining the stream",
        )
        second.send_signal(signal.SIGTERM)
        assert second.wait(10) == 0  # clean stop on SIGTERM
    finally:
        second.kill()
    client = client_for(ch_url)  # the subprocesses are gone: this process may own the engine now
    try:
        rows = client.query(f"SELECT RequestId FROM {schema.table_name(client)}")  # no FINAL needed
        assert sorted(r["RequestId"] for r in rows) == sorted(f"r{i}" for i in range(400))
    finally:
        close_all()


@pytest.mark.slow
def test_history_migrate_command(settings, ch_url: str) -> None:  # type: ignore[no-untyped-def]
    settings.CLICKHOUSE_URL = ch_url
    settings.HISTORY_RETENTION_DAYS = 9
    try:
        call_command("history_migrate")
        call_command("history_migrate")
        client = client_for(ch_url)
        engine = client.query("SELECT engine_full FROM system.tables WHERE name = 'otel_traces'")[0]
        assert "toIntervalDay(9)" in engine["engine_full"]
    finally:
        close_all()


def test_history_migrate_unavailable(settings) -> None:  # type: ignore[no-untyped-def]
    from django.core.management.base import CommandError

    close_all()
    settings.CLICKHOUSE_URL = "http://127.0.0.1:1"
    with pytest.raises(CommandError, match="unavailable"):
        call_command("history_migrate")
    close_all()


def test_start_in_background(  # type: ignore[no-untyped-def]
    settings,
    monkeypatch,
    provider: TracerProvider,
    sredis: redis.Redis,
    keys: KeySpace,
    valkey_url: str,
    ch_url: str,
) -> None:
    from pools import connections

    monkeypatch.setattr(connections, "valkey_url", lambda: valkey_url)
    settings.DISPATCH_KEY_PREFIX = keys.prefix
    settings.CLICKHOUSE_URL = ch_url
    tracer = provider.get_tracer("t")
    for _ in range(5):
        tracer.start_span("chat x").end()
    provider.force_flush()
    begun = time.monotonic()
    try:
        started = ingester_mod.start_in_background()
        assert started is not None
        assert ingester_mod.start_in_background() is started  # once per process
        # The thread opens chDB and migrates the schema first (seconds of CPU): ready at its first read.
        wait_for_start(
            lambda: _read_since(sredis, keys, started.consumer, begun), what="the background ingester"
        )
        wait_until_sync(lambda: started.stats.acked == 5, 15, what="5 spans acknowledged")
        tracer.start_span("chat y").end()
        provider.force_flush()
        wait_until_sync(lambda: started.stats.acked == 6, 15, what="the 6th span acknowledged")
    finally:
        ingester_mod.stop_background()
        close_all()
    settings.CLICKHOUSE_URL = "http://127.0.0.1:8123"
    assert ingester_mod.start_in_background() is None  # a ClickHouse server: run `runhistory` instead


def test_a_closed_client_never_reopens_its_engine_behind_the_next_ones_back(tmp_path: Path) -> None:
    """A background ingester that outlives its stop's join still holds the old client: were its next
    call to reconnect, this process would host two chDB engines and every later history call fail."""
    old = client_for(f"chdb://{tmp_path / 'old'}")
    try:
        assert old.command("SELECT 1") == 1
        close_all()
        with pytest.raises(HistoryUnavailable, match="closed"):
            old.command("SELECT 1")
        new = client_for(f"chdb://{tmp_path / 'new'}")
        assert new is not old and new.command("SELECT 2") == 2
        with pytest.raises(HistoryUnavailable, match="closed"):
            old.command("SELECT 1")
        assert "closed" in repr(old)
    finally:
        close_all()
