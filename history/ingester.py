"""The history ingester: span stream -> ClickHouse, at least once, never blocking dispatch.

A consumer-group reader. Each round it reads a batch with XREADGROUP, inserts it into ClickHouse in one
INSERT, then XACKs it and trims the stream up to its oldest still-pending entry (so what the exporter's
MAXLEN cap deletes later is exactly what was never stored; see ``runtime.telemetry.tracing``).
On start it first re-reads its own pending entries (``XREADGROUP ... 0``: a killed ingester's
in-flight batch) and claims entries other consumers left pending for longer than ``claim_idle_s``
(XAUTOCLAIM). A crash between insert and XACK re-delivers that batch, the same entry ids in the same
order (entries the stream's cap deleted meanwhile come back empty and are acknowledged with the rest);
its insert carries a deduplication token made from those ids, so ClickHouse drops the repeat even when
it holds fewer rows (see ``history.schema``). With ClickHouse or Valkey down the batch stays pending in the
stream and the ingester retries with exponential backoff.

Read-ahead: under backlog (the last batch was ``batch_size`` new entries) the next batch is read and
decoded while chDB stores the current one on a thread of its own (its insert releases the GIL), so the
Python half of the work and the engine's half overlap on two cores. At most two batches are pending:
the one being inserted, which is full, and the one read ahead; a restart's pending re-read, ``batch_size``
at a time, gives them back as they were, so each keeps its deduplication token.

Cost: each insert writes a part into ``otel_traces`` and into every view's table, so the ingester makes
few, big inserts: up to ``batch_size`` spans, and while it keeps up at most one per
``min_insert_interval_s``. Spans go in as typed Native columns. A ClickHouse server's asynchronous
inserts (``async_insert=1``) would buffer small inserts into big parts server-side, but their
deduplication is documented for Replicated tables only, and these inserts are big already: not used.

``python manage.py runhistory`` runs :class:`Ingester` in the foreground; the web process that owns an
embedded chDB database calls :func:`start_in_background`.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from history import schema
from history.client import HistoryClient, HistoryUnavailable
from history.spans import batch_token, entry_row, span_row
from runtime.backoff import Backoff
from runtime.queue.keys import KeySpace
from runtime.queue.scripts import SPANS_TRIM_ACKED

__all__ = ["Ingester", "IngesterCrash", "IngesterStats", "batch_token", "span_row"]  # decode re-exported

log = logging.getLogger(__name__)

GROUP = "history"
DEFAULT_CONSUMER = "history-ingester"
# Each INSERT has a fixed cost (a part and a deduplication log entry per table and day); when the
# ingester keeps up, rounds read what arrived meanwhile, so big batches only form under backlog.
DEFAULT_BATCH_SIZE = 10_000
# The least time between two inserts while the ingester keeps up (spans reach history this much later).
INSERT_INTERVAL_S = 0.5


class IngesterCrash(Exception):
    """Raised by test hooks to simulate a process dying between two steps."""


@dataclass(slots=True)
class IngesterStats:
    inserted: int = 0
    acked: int = 0
    malformed: int = 0
    batches: int = 0
    failures: int = 0
    redelivered: int = 0


Entry = tuple[bytes, dict[bytes, bytes]]  # a stream entry as XREADGROUP gives it: id, fields


@dataclass(slots=True)
class _Batch:
    """One XREADGROUP's entries, decoded for one INSERT."""

    ids: list[bytes]  # every entry read, also those with nothing to store: all are acknowledged
    columns: list[tuple[Any, ...]]  # schema.INSERT_COLUMNS, column-oriented
    rows: int
    full: bool  # batch_size new entries: more are waiting, so the next batch is read ahead


class _Insert:
    """One INSERT on a thread of its own, so that the caller can read and decode meanwhile."""

    def __init__(self, insert: Callable[[], None]) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(insert,), name="history-insert", daemon=True)
        self._thread.start()

    def _run(self, insert: Callable[[], None]) -> None:
        try:
            insert()
        except BaseException as exc:  # handed to the caller's thread by wait()
            self._error = exc

    def wait(self) -> None:
        self._thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error


class Ingester:
    """Reads the span stream with a consumer group and batch-inserts into ClickHouse."""

    def __init__(
        self,
        redis_client: redis.Redis,
        history: HistoryClient,
        *,
        keys: KeySpace,
        consumer: str = DEFAULT_CONSUMER,
        batch_size: int = DEFAULT_BATCH_SIZE,
        block_ms: int = 500,
        claim_idle_s: float = 60.0,
        retention_days: int = 30,
        max_backoff_s: float = 30.0,
        after_insert: Callable[[int], None] | None = None,
        min_insert_interval_s: float = 0.0,
        read_ahead: bool = True,
    ) -> None:
        self.redis = redis_client
        self.history = history
        self.keys = keys
        self.stream = keys.span_stream()
        self.consumer = consumer
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.claim_idle_s = claim_idle_s
        self.retention_days = retention_days
        self.max_backoff_s = max_backoff_s
        self.after_insert = after_insert  # test hook: runs between INSERT and XACK
        # While it keeps up, the ingester waits this long between inserts so that each one takes what
        # arrived meanwhile: every insert writes a part per table, and small parts cost merges later.
        self.min_insert_interval_s = min_insert_interval_s
        self.read_ahead = read_ahead  # off: one batch at a time (a benchmark's baseline)
        self._caught_up_at: float | None = None  # when the last batch smaller than batch_size ended
        self.stats = IngesterStats()
        self._trim = redis_client.register_script(SPANS_TRIM_ACKED)
        self._migrated = False
        self._backlog_done = False
        self._ahead: _Batch | None = None  # read and decoded while the batch before it was inserted
        self._backoff = Backoff(0.2, max_backoff_s)
        self._last_pause = 0.0

    def __repr__(self) -> str:
        s = self.stats
        return (
            f"<Ingester {self.stream} consumer={self.consumer} inserted={s.inserted} acked={s.acked} "
            f"malformed={s.malformed} failures={s.failures} backoff={self._last_pause:.1f}s>"
        )

    def _ensure_group(self) -> None:
        try:
            self.redis.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _read(self) -> tuple[list[Entry], bool]:
        """The next batch and whether it is full of new entries (so that another may follow at once)."""
        if not self._backlog_done:
            # Our own pending entries first: the batch a killed predecessor inserted but did not ack.
            # Entries the cap deleted come back with no fields: they stay in the batch so that its
            # ids, and so its deduplication token, are those of the first delivery.
            got = self.redis.xreadgroup(GROUP, self.consumer, {self.stream: "0"}, count=self.batch_size)
            entries = got[0][1] if got else []
            if any(fields for _, fields in entries):
                self.stats.redelivered += sum(1 for _, fields in entries if fields)
                return entries, False
            self._ack_deleted([i for i, _ in entries])
            self._backlog_done = True
            claimed = self.redis.xautoclaim(
                self.stream, GROUP, self.consumer, int(self.claim_idle_s * 1000), "0-0", count=self.batch_size
            )
            if claimed and claimed[1]:
                self._backlog_done = False  # read them back as our own pending entries
                return self._read()
        if self._caught_up_at is not None:
            time.sleep(max(0.0, self._caught_up_at + self.min_insert_interval_s - time.monotonic()))
        return self._read_new(self.block_ms)

    def _read_new(self, block_ms: int | None) -> tuple[list[Entry], bool]:
        got = self.redis.xreadgroup(
            GROUP, self.consumer, {self.stream: ">"}, count=self.batch_size, block=block_ms
        )
        entries = got[0][1] if got else []
        full = len(entries) >= self.batch_size
        self._caught_up_at = None if full else time.monotonic()
        return entries, full

    def _ack_deleted(self, ids: list[bytes]) -> None:
        if ids:  # pending entries that the MAXLEN cap already removed: nothing to store
            self.redis.xack(self.stream, GROUP, *ids)

    def _decode(self, read: tuple[list[Entry], bool]) -> _Batch:
        entries, full = read
        rows = []
        for entry_id, fields in entries:
            if not fields:  # deleted by the stream's cap after its first delivery
                continue
            try:
                rows.append(entry_row(fields[b"span"]))
            except Exception:
                self.stats.malformed += 1
                log.warning("history: dropping malformed span entry %s", entry_id)
        # Column-oriented: the driver writes each Native column straight from its list instead of
        # transposing row by row (zip does that in C).
        columns = list(zip(*rows, strict=True))
        return _Batch([entry_id for entry_id, _ in entries], columns, len(rows), full)

    def _insert(self, batch: _Batch) -> None:
        self.history.insert(
            schema.TABLE,
            batch.columns,
            schema.INSERT_COLUMNS,
            dedup_token=batch_token(batch.ids),
            column_oriented=True,
            column_types=schema.INSERT_TYPES,
        )

    def step(self) -> int:
        """One round: read, insert, ack. Returns entries acknowledged; raises on Valkey/ClickHouse errors.

        After a full batch of new entries the next is read and decoded while this one is inserted (chDB
        releases the GIL while it stores). That batch stays pending, unacknowledged, until its own
        round: after a crash the pending entries are re-read ``batch_size`` at a time, which gives back
        exactly the full batch that was being inserted (same ids, same deduplication token), then the
        one read ahead.
        """
        if not self._migrated:
            schema.migrate(self.history, retention_days=self.retention_days)
            self._migrated = True
        try:
            return self._round()
        except BaseException:
            # What was read ahead is pending in the stream: read again, in order, after its predecessor.
            self._ahead = None
            self._backlog_done = False
            raise

    def _round(self) -> int:
        batch, self._ahead = self._ahead, None
        if batch is None:
            self._ensure_group()
            batch = self._decode(self._read())
        if not batch.ids:
            return 0
        if batch.rows and batch.full and self._backlog_done and self.read_ahead:
            insert = _Insert(functools.partial(self._insert, batch))
            try:
                ahead = self._decode(self._read_new(None))  # no BLOCK: an empty stream must not delay the ack
                self._ahead = ahead if ahead.ids else None
            finally:
                insert.wait()
        elif batch.rows:
            self._insert(batch)
        self.stats.inserted += batch.rows
        if self.after_insert is not None:
            self.after_insert(batch.rows)
        self.redis.xack(self.stream, GROUP, *batch.ids)
        self._trim(keys=[self.stream], args=[GROUP])
        self.stats.acked += len(batch.ids)
        self.stats.batches += 1
        return len(batch.ids)

    def run(self, stop: threading.Event) -> None:
        """Runs rounds until ``stop`` is set; errors back off exponentially and are retried."""
        log.info("history ingester started: %r", self)
        while not stop.is_set():
            try:
                self.step()
                self._backoff.reset()
                self._last_pause = 0.0
            except IngesterCrash:
                raise
            except (HistoryUnavailable, redis.RedisError, OSError) as exc:
                self._fail(stop, exc)
            except Exception as exc:
                log.exception("history ingester round failed")
                self._fail(stop, exc)
        log.info("history ingester stopped: %r", self)

    def _fail(self, stop: threading.Event, exc: Exception) -> None:
        self.stats.failures += 1
        self._migrated = self._migrated and not isinstance(exc, HistoryUnavailable)
        self._backlog_done = False  # re-read what we hold pending, in the same order
        self._last_pause = self._backoff.next()
        log.warning("history ingester: %s; retrying in %.1fs", exc, self._last_pause)
        stop.wait(self._last_pause)


# --- background runner for the process that owns an embedded database -----------------------------


@dataclass(slots=True)
class _Background:
    thread: threading.Thread
    stop: threading.Event
    ingester: Ingester


_background: _Background | None = None
_background_lock = threading.Lock()


def build_from_settings(**kwargs: Any) -> Ingester:
    """An ingester wired from Django settings (Valkey URL, key prefix, CLICKHOUSE_URL, retention)."""
    from django.conf import settings

    from history.client import history_client
    from pools import connections

    client = connections.sync_client()
    kwargs.setdefault("consumer", f"{DEFAULT_CONSUMER}-{socket.gethostname()}")
    # The client gives up on a read after DISPATCH_VALKEY_HEALTH_S: a blocking read stays well within it.
    kwargs.setdefault("block_ms", min(500, int(settings.DISPATCH_VALKEY_HEALTH_S * 500)))
    kwargs.setdefault("min_insert_interval_s", INSERT_INTERVAL_S)
    return Ingester(
        client,
        history_client(),
        keys=connections.key_space(),
        retention_days=int(settings.HISTORY_RETENTION_DAYS),
        **kwargs,
    )


def start_in_background(*, force: bool = False) -> Ingester | None:
    """Starts the ingester on a daemon thread of this process, once; returns it (None when skipped).

    By default it runs only when ``CLICKHOUSE_URL`` is an embedded ``chdb://`` database, which this process
    must then own; with a ClickHouse server run ``manage.py runhistory`` instead (or pass ``force=True``).
    Never raises: a failure to start is logged.
    """
    global _background
    from django.conf import settings

    if not force and not str(settings.CLICKHOUSE_URL).startswith("chdb:"):
        return None
    with _background_lock:
        if _background is not None and _background.thread.is_alive():
            return _background.ingester
        try:
            ingester = build_from_settings()
        except Exception:
            log.exception("history ingester could not start")
            return None
        stop = threading.Event()
        thread = threading.Thread(
            target=ingester.run, args=(stop,), name=f"history-ingester-{os.getpid()}", daemon=True
        )
        thread.start()
        _background = _Background(thread, stop, ingester)
        return ingester


def stop_background(timeout_s: float = 5.0) -> None:
    """Stops the background ingester (if any) and waits for its current round, at most ``timeout_s``."""
    global _background
    with _background_lock:
        bg, _background = _background, None
    if bg is not None:
        bg.stop.set()
        bg.thread.join(timeout_s)
