"""The ingress's uvicorn protocol (``ingress.protocol``) on a real uvicorn server over real sockets.

Each response's head leaves in the same write as its first body bytes (one write for a complete
answer, one for a stream's head and first chunk); a head the app sends before it waits still leaves
at once; ``Expect: 100-continue`` and keep-alive work as with uvicorn's own httptools protocol; a
finished request's cycle is freed by reference counting, without the cyclic GC.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
from uvicorn.server import ServerState

from ingress.protocol import HeadHeldTransport, HeadWithBodyProtocol

BODY = b'{"ok": true}'
PAUSE_S = 0.3


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/complete``: one JSON body; ``/stream``: three chunks 10 ms apart; ``/late``: the head, a
    pause, then the body; every path echoes the request body's length."""
    assert scope["type"] == "http"
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    headers = [(b"x-size", str(size).encode())]
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for i in range(3):
            await send({"type": "http.response.body", "body": b"data: %d\n\n" % i, "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b""})
        return
    headers.append((b"content-length", str(len(BODY)).encode()))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    if scope["path"] == "/late":
        await asyncio.sleep(PAUSE_S)
    await send({"type": "http.response.body", "body": BODY})


class Server:
    """uvicorn's protocol class ``HeadWithBodyProtocol`` served on a free port of this loop; keeps
    every connection's protocol so a test can read its cycles' write counts."""

    def __init__(self) -> None:
        self.config = uvicorn.Config(app, http=HeadWithBodyProtocol, lifespan="off", log_config=None)
        self.config.load()
        self.state = ServerState()
        self.protocols: list[HeadWithBodyProtocol] = []
        self.transports: list[HeadHeldTransport] = []
        self.cycles: list[weakref.ref[RequestResponseCycle]] = []  # every request's, weakly

    def protocol(self) -> HeadWithBodyProtocol:
        made = _Recording(self.config, self.state, {}, asyncio.get_running_loop())
        made.recorded = self.transports
        made.cycles = self.cycles
        self.protocols.append(made)
        return made


class _Recording(HeadWithBodyProtocol):
    recorded: list[HeadHeldTransport]
    cycles: list[weakref.ref[RequestResponseCycle]]

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        assert isinstance(self.cycle.transport, HeadHeldTransport)
        self.recorded.append(self.cycle.transport)
        self.cycles.append(weakref.ref(self.cycle))


@pytest.fixture
async def served() -> AsyncIterator[tuple[Server, str]]:
    server = Server()
    listener = await asyncio.get_running_loop().create_server(server.protocol, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        for protocol in server.protocols:
            protocol.transport.close()
        listener.close()
        await listener.wait_closed()


async def test_a_complete_answer_leaves_in_one_write(served: tuple[Server, str]) -> None:
    server, url = served
    async with httpx.AsyncClient() as http:
        for _ in range(3):  # keep-alive: each cycle of the connection holds its own head
            response = await http.post(f"{url}/complete", content=b"12345")
            assert (response.status_code, response.content) == (200, BODY)
            assert response.headers["x-size"] == "5"
    assert len(server.protocols) == 1
    assert [t.writes for t in server.transports] == [1, 1, 1]


async def test_a_streams_head_leaves_with_its_first_chunk(served: tuple[Server, str]) -> None:
    server, url = served
    async with httpx.AsyncClient() as http, http.stream("POST", f"{url}/stream", content=b"") as r:
        assert r.headers["transfer-encoding"] == "chunked"
        assert [line async for line in r.aiter_lines() if line] == ["data: 0", "data: 1", "data: 2"]
    # head + chunk 0, chunk 1, chunk 2, the last (empty) chunk: uvicorn's own made five writes
    assert [t.writes for t in server.transports] == [4]


async def test_a_head_sent_before_the_app_waits_leaves_at_once(served: tuple[Server, str]) -> None:
    server, url = served
    port = int(url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        sent = time.monotonic()
        writer.write(b"POST /late HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), PAUSE_S)
        head_after = time.monotonic() - sent
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert await asyncio.wait_for(reader.readexactly(len(BODY)), 5) == BODY
        assert time.monotonic() - sent >= PAUSE_S > head_after
    finally:
        writer.close()
    assert [t.writes for t in server.transports] == [2]


async def test_expect_100_continue_is_answered_before_the_body_is_sent(
    served: tuple[Server, str],
) -> None:
    _, url = served
    port = int(url.rsplit(":", 1)[1])

    def talk() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(
                b"POST /complete HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n"
            )
            interim = sock.recv(1024)
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"  # before any body byte was sent
            sock.sendall(b"abc")
            answer = b""
            while not answer.endswith(BODY):
                answer += sock.recv(4096)
            return answer

    answer = await asyncio.to_thread(talk)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"x-size: 3\r\n" in answer


async def test_a_finished_requests_cycle_is_freed_without_the_cyclic_gc(
    served: tuple[Server, str],
) -> None:
    # A cycle and its transport referring to each other made every request (its cycle, scope, headers,
    # body and event, ~14 objects) garbage that only the cyclic GC frees: a young collection every
    # ~40 requests, and an older one every ~400 (bench/RESULTS.md, issue 23 session 11).
    server, url = served
    gc.disable()
    try:
        async with httpx.AsyncClient() as http:
            for path in ("/complete", "/stream", "/complete"):  # keep-alive: the next one drops the last
                response = await http.post(f"{url}{path}", content=b"12345")
                assert response.status_code == 200
        await asyncio.sleep(0)  # the last request's task lets go of its cycle
        assert [cycle() is None for cycle in server.cycles] == [True, True, False]
    finally:
        gc.enable()
