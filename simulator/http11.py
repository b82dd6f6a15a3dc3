"""A small HTTP/1.1 server on asyncio streams, for the backend simulator.

Keep-alive, ``Content-Length`` request bodies (chunked ones are refused with 411), one request at a
time per connection, responses built in one write. Enough to be a fast, real HTTP peer for the
adapter's httpx client; not a general-purpose web server.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

Handler = Callable[[str, str, bytes], Awaitable[tuple[int, bytes, bytes]]]
"""(method, path without query, body) -> (status, body, content type)."""
ErrorBody = Callable[[int, str], bytes]
JSON = b"application/json"
MAX_HEAD_BYTES = 64 * 1024

REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    411: "Length Required",
    413: "Content Too Large",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class HTTPRefusal(Exception):
    """An early HTTP-level refusal; the connection is closed after it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def response(status: int, body: bytes, content_type: bytes = JSON, *, close: bool = False) -> bytes:
    reason = REASONS.get(status, "Unknown").encode()
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n" % (
        status,
        reason,
        content_type,
        len(body),
    )
    if close:
        head += b"Connection: close\r\n"
    return head + b"\r\n" + body


def parse_head(head: bytes, max_body_bytes: int) -> tuple[str, str, int, bool]:
    """(method, path, content length, keep-alive) of a request head; raises HTTPRefusal."""
    lines = head[:-4].split(b"\r\n")
    try:
        method, target, version = lines[0].decode("latin-1").split(" ")
    except ValueError:
        raise HTTPRefusal(400, "malformed request line") from None
    keep_alive = version == "HTTP/1.1"
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise HTTPRefusal(400, "invalid Content-Length") from None
            if length < 0:
                raise HTTPRefusal(400, "invalid Content-Length")
        elif name == b"transfer-encoding":
            raise HTTPRefusal(411, "chunked request bodies are not supported; send Content-Length")
        elif name == b"connection":
            token = value.strip().lower()
            keep_alive = token == b"keep-alive" or (keep_alive and token != b"close")
    if length > max_body_bytes:
        raise HTTPRefusal(413, f"request body over {max_body_bytes} bytes")
    return method, target.partition("?")[0], length, keep_alive


class HTTP11Server:
    """Serves ``handler`` on a TCP port; ``on_refused(status)`` hears of requests refused before it."""

    def __init__(
        self,
        handler: Handler,
        *,
        error_body: ErrorBody,
        on_refused: Callable[[int], None],
        max_body_bytes: int,
    ) -> None:
        self.handler = handler
        self.error_body = error_body
        self.on_refused = on_refused
        self.max_body_bytes = max_body_bytes
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"<HTTP11Server connections={len(self._connections)}>"

    async def start(self, host: str, port: int) -> int:
        """Starts listening; returns the bound port."""
        self._server = await asyncio.start_server(
            self._serve_connection, host, port, backlog=1024, limit=MAX_HEAD_BYTES
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        await server.wait_closed()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while await self._serve_one(reader, writer):
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away mid-request
        except asyncio.CancelledError:
            pass  # server stopping
        finally:
            self._connections.discard(task)
            with contextlib.suppress(ConnectionError):
                writer.close()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Reads one request and writes its response; False when the connection must close."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False  # clean close between requests
        except asyncio.LimitOverrunError:
            writer.write(self._refuse(431, "request headers too large"))
            return False
        try:
            method, path, length, keep_alive = parse_head(head, self.max_body_bytes)
            body = await reader.readexactly(length) if length else b""
        except HTTPRefusal as exc:
            writer.write(self._refuse(exc.status, str(exc)))
            return False
        status, payload, content_type = await self.handler(method, path, body)
        writer.write(response(status, payload, content_type, close=not keep_alive))
        return keep_alive

    def _refuse(self, status: int, message: str) -> bytes:
        self.on_refused(status)
        return response(status, self.error_body(status, message), close=True)
