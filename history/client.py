"""One ClickHouse client per process, from ``CLICKHOUSE_URL``, behind a lock.

``chdb:///path`` runs the ClickHouse engine in-process (clickhouse-connect's chDB backend). chDB hosts
one engine per process and directory, so the process that owns an embedded database runs both the
ingester and the history queries on this one shared client. ``http(s)://user:pw@host:8123/db`` talks
to a ClickHouse server. Every driver or network error leaves this module as :class:`HistoryUnavailable`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from runtime.backends.redact import redact_url

log = logging.getLogger(__name__)

DEFAULT_DATABASE = "otel"  # the OpenTelemetry Collector ClickHouse exporter's default database


class HistoryUnavailable(Exception):
    """ClickHouse could not be reached or refused a statement; the message is safe to show."""


class HistoryClient:
    """A locked clickhouse-connect client for one URL; (re)connects lazily after a failure."""

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urlsplit(url)
        self.embedded = parts.scheme == "chdb"
        path_db = parts.path.strip("/") if not self.embedded else ""
        self.database = path_db or DEFAULT_DATABASE
        self._lock = threading.RLock()
        self._client: Any = None
        # Set by close(): a closed client never reconnects. A thread still holding it (an ingester that
        # outlived its stop's join) would otherwise reopen its chDB engine behind the back of the next
        # client, and chDB hosts one engine per process: every later history call would fail.
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "connected" if self._client is not None else "disconnected"
        return f"<HistoryClient {redact_url(self.url)} db={self.database} {state}>"

    def _connect(self) -> Any:
        import clickhouse_connect

        if self.embedded:
            return clickhouse_connect.get_client(dsn=self.url)
        parts = urlsplit(self.url)
        base = f"{parts.scheme}://{parts.netloc}"
        return clickhouse_connect.get_client(
            dsn=base,
            connect_timeout=2,
            send_receive_timeout=15,
            query_retries=0,
            autogenerate_session_id=False,
        )

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._closed:
                raise HistoryUnavailable(f"the client of {redact_url(self.url)} is closed")
            try:
                if self._client is None:
                    self._client = self._connect()
                return getattr(self._client, method)(*args, **kwargs)
            except Exception as exc:
                raise self._unavailable(exc) from exc

    def _unavailable(self, exc: Exception) -> HistoryUnavailable:
        if not self.embedded:
            self._drop()
        reason = f"{type(exc).__name__}: {_first_line(exc)}"
        return HistoryUnavailable(f"ClickHouse at {redact_url(self.url)} is unavailable: {reason}")

    def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                log.debug("closing ClickHouse client failed", exc_info=True)

    def command(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        return self._call("command", sql, parameters=parameters)

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        result = self._call("query", sql, parameters=parameters)
        names = result.column_names
        return [dict(zip(names, row, strict=True)) for row in result.result_rows]

    def column_blocks(
        self, sql: str, parameters: dict[str, Any] | None = None, *, block_rows: int = 16384
    ) -> Iterator[dict[str, Sequence[Any]]]:
        """The result of ``sql`` block by block, each as columns (name -> values), at most ``block_rows``
        rows a block: a large result is streamed, never held in Python whole. Holds the client until the
        iteration ends; close it (``contextlib.closing``) when leaving early."""
        with self._lock:
            try:
                if self._client is None:
                    self._client = self._connect()
                stream = self._client.query_column_block_stream(
                    sql, parameters=parameters, settings={"max_block_size": block_rows}
                )
            except Exception as exc:
                raise self._unavailable(exc) from exc
            with stream:
                names = stream.source.column_names
                blocks = iter(stream)
                while True:
                    try:
                        block = next(blocks)
                    except StopIteration:
                        return
                    except Exception as exc:
                        raise self._unavailable(exc) from exc
                    yield dict(zip(names, block, strict=True))

    def insert(
        self,
        table: str,
        rows: Sequence[Sequence[Any]],
        column_names: Sequence[str],
        *,
        dedup_token: str | None = None,
        column_oriented: bool = False,
        column_types: Sequence[str] | None = None,
    ) -> None:
        """Inserts rows (or columns, with ``column_oriented``); a repeated ``dedup_token`` makes the repeat
        a no-op, in the views' tables too. ``column_types`` spares the driver a DESCRIBE per insert."""
        settings = None
        if dedup_token:
            settings = {
                "insert_deduplication_token": dedup_token,
                "deduplicate_blocks_in_dependent_materialized_views": 1,
            }
        self._call(
            "insert",
            table,
            rows,
            column_names=list(column_names),
            database=self.database,
            settings=settings,
            column_oriented=column_oriented,
            column_type_names=list(column_types) if column_types else None,
        )

    def close(self) -> None:
        """Closes the connection for good (:func:`client_for` makes a new client for the URL)."""
        with self._lock:
            self._closed = True
            self._drop()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return redact_url(text[0])[:300] if text else ""


_clients: dict[str, HistoryClient] = {}
_clients_lock = threading.Lock()


def client_for(url: str) -> HistoryClient:
    """The process's client for ``url``. Opening another URL closes the others (one chDB engine)."""
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            for other in _clients.values():
                other.close()
            _clients.clear()
            client = _clients[url] = HistoryClient(url)
        return client


def history_client() -> HistoryClient:
    """The client for Django's ``settings.CLICKHOUSE_URL``."""
    from django.conf import settings

    return client_for(str(settings.CLICKHOUSE_URL))


def close_all() -> None:
    with _clients_lock:
        for client in _clients.values():
            client.close()
        _clients.clear()
