"""A keep-alive HTTP/1.1 connection pool for one origin, for whole (non-streamed) POSTs.

Why: after the Valkey round trips were cut, aiohttp's client was the largest part of the dispatcher's
CPU per call (a quarter of its samples at concurrency 16: request and response objects, header
multidicts, timers, signals). A call here is one prepared write and httptools' C parser (llhttp, as
uvicorn uses) on the answer. Streaming, proxies and everything else stay with aiohttp.

Behaviour kept from aiohttp's pool: at most ``max_connections`` open, idle ones reused newest first
and dropped after ``keepalive_s``, a request resent once only when it could not be written at all
(the idle connection was already closing), and a call that waits for a free connection longer than
the pool timeout fails with :class:`~runtime.backends.http.errors.PoolWaitTimeout`.

Failures are the lower layer's own, translated once by the adapter
(:func:`runtime.backends.http.errors.backend_error`): :class:`ConnectFailed` before anything was sent,
httptools' ``HttpParserError`` or a ``ConnectionError`` once the request may have reached the backend.
"""

from __future__ import annotations

import asyncio
import ssl
import time

import httptools

from runtime.backends.body import BodyResponse
from runtime.backends.http.errors import ConnectFailed, PoolWaitTimeout

__all__ = ["Http1Pool"]


class _Connection(asyncio.Protocol):
    """One connection; one exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: asyncio.Future[BodyResponse] | None = None
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.closed = False
        self.idle_since = 0.0
        self.headers_done = False
        self.keep_alive = False

    # --- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        body_until_close = self.headers_done and not (
            "content-length" in self.headers or "transfer-encoding" in self.headers
        )
        if body_until_close:  # an answer that ends when the server closes (no length, not chunked)
            self.on_message_complete()
        else:
            lost = ConnectionResetError(f"server disconnected without a whole answer: {exc or 'EOF'}")
            lost.__cause__ = exc
            self._fail(lost)

    # --- httptools callbacks -----------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()  # known only now: the parser resets after
        answer = self.answer
        if answer is not None and not answer.done():
            answer.set_result(BodyResponse(self.parser.get_status_code(), self.headers, b"".join(self.body)))
        self.answer = None

    # --- use ---------------------------------------------------------------------------------------
    def send(self, request: bytes) -> asyncio.Future[BodyResponse]:
        assert self.transport is not None
        self.headers, self.body, self.headers_done, self.keep_alive = {}, [], False, False
        self.answer = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.answer

    def reusable(self) -> bool:
        return not self.closed and self.keep_alive

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: Exception) -> None:
        answer = self.answer
        if answer is not None and not answer.done():
            answer.set_exception(exc)
        self.answer = None
        self.close()


class Http1Pool:
    """``await post(request, ...)``: the whole answer of one POST to this origin."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None,
        max_connections: int,
        keepalive_s: float,
    ) -> None:
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.keepalive_s = keepalive_s
        self._idle: list[_Connection] = []
        self.max_connections = max_connections
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False
        self.opened = 0  # connections opened so far

    def __repr__(self) -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"<Http1Pool {scheme}://{self.host}:{self.port} idle={len(self._idle)} opened={self.opened}>"

    @property
    def idle(self) -> tuple[_Connection, ...]:
        """The connections kept for reuse, oldest first (a copy: the pool alone adds and takes)."""
        return tuple(self._idle)

    @property
    def saturated(self) -> bool:
        """Whether every connection is taken: the next POST waits (at most its pool timeout) for one."""
        return self._slots.locked()

    async def post(
        self, request: bytes, *, connect_timeout_s: float | None, pool_timeout_s: float | None
    ) -> BodyResponse:
        """Sends ``request`` (a whole HTTP/1.1 request) and returns the answer. ``pool_timeout_s``
        bounds the wait for a free connection (None: wait as long as the caller does)."""
        if pool_timeout_s is not None and self._slots.locked():
            await self._wait_for_slot(pool_timeout_s)
        else:  # the common case: a connection is free, no timer armed
            await self._slots.acquire()
        try:
            for _ in range(2):
                connection = self._take_idle() or await self._open(connect_timeout_s)
                if connection.closed:  # closed by the server between the take and now: never sent
                    continue
                try:
                    answer = await connection.send(request)
                except BaseException:  # cut (timeout, cancel) or failed: the connection's state is unknown
                    connection.close()
                    raise
                if connection.reusable() and not self._closed:
                    connection.idle_since = time.monotonic()
                    self._idle.append(connection)
                else:
                    connection.close()
                return answer
        finally:
            self._slots.release()
        raise ConnectionResetError(f"{self!r}: the server closed two connections before the request")

    async def _wait_for_slot(self, pool_timeout_s: float) -> None:
        try:
            async with asyncio.timeout(pool_timeout_s):
                await self._slots.acquire()
        except TimeoutError as exc:
            raise PoolWaitTimeout(
                f"{self!r}: all {self.max_connections} connections stayed busy for {pool_timeout_s}s"
            ) from exc

    def close(self) -> None:
        """Closes the idle connections; those in use close when their call ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and now - connection.idle_since < self.keepalive_s:
                return connection
            connection.close()
        return None

    async def _open(self, connect_timeout_s: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout_s):
                _, connection = await loop.create_connection(
                    _Connection,
                    self.host,
                    self.port,
                    ssl=self.ssl_context,
                    server_hostname=self.host if self.ssl_context else None,
                )
        except (OSError, TimeoutError) as exc:
            raise ConnectFailed(f"could not connect to {self.host}:{self.port}: {exc}") from exc
        self.opened += 1
        return connection
