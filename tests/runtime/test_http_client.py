"""The default endpoint client (BackendHttpClient: the lean pool, aiohttp for streams) against real
servers over TCP."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import warnings
from collections.abc import AsyncIterator

import aiohttp
import pytest

from runtime.backends.adapter import OpenAIBackend
from runtime.backends.http.client import BackendHttpClient
from runtime.errors import BackendConnectError, BackendError, BackendHTTPError, BackendTimeout
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.backend_pool import open_pool

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def sim() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(SimulatorConfig(model="sim-int", default_completion_tokens=5)) as server:
        yield server


async def test_the_default_client_reuses_one_keep_alive_connection(sim: SimulatorServer) -> None:
    backend = OpenAIBackend(sim.url)  # made outside any call: pools open on first use
    try:
        assert isinstance(backend._client, BackendHttpClient)
        for _ in range(3):
            assert (await backend.complete(BODY)).status_code == 200
        (pool,) = backend._client.origin_pools  # whole POSTs: the lean HTTP/1.1 pool
        assert pool.opened == 1
    finally:
        await backend.aclose()
    assert backend._client.is_closed


async def test_stream_relays_chunks_from_the_real_simulator(sim: SimulatorServer) -> None:
    async with open_pool() as pool:
        chunks = [c async for c in pool.get(sim.url).stream(BODY)]
    deltas = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert sum(1 for d in deltas if d) == 5
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_stream_refused_by_the_backend_is_typed(sim: SimulatorServer) -> None:
    async with open_pool() as pool:
        with pytest.raises(BackendHTTPError, match="no capacity") as info:
            [
                c
                async for c in pool.get(sim.url).stream(
                    {**BODY, "sim": {"status": 503, "message": "no capacity"}}
                )
            ]
    assert info.value.status_code == 503


async def test_connection_dropped_after_the_request_is_not_a_connect_error() -> None:
    """The backend may have run the call: it must not look like a failure to connect (retryable)."""
    received = asyncio.Event()

    async def read_then_hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        received.set()
        writer.close()

    server = await asyncio.start_server(read_then_hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    backend = OpenAIBackend(f"http://127.0.0.1:{port}/v1")
    try:
        with pytest.raises(BackendError) as info:
            await backend.complete(BODY)
    finally:
        await backend.aclose()
        server.close()
        await server.wait_closed()
    assert received.is_set()
    assert type(info.value) is BackendError
    assert "failed mid-call" in str(info.value)
    assert not isinstance(info.value, BackendConnectError)


async def test_closing_leaves_no_unclosed_session_behind(sim: SimulatorServer) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with open_pool() as pool:
            await pool.get(sim.url).complete(BODY)
        gc.collect()
    assert not [w for w in caught if "Unclosed" in str(w.message)]


async def test_idle_connections_are_dropped_before_uvicorns_keep_alive_ends(sim: SimulatorServer) -> None:
    """uvicorn (vLLM, SGLang, LiteLLM) closes a connection idle for 5 s; reusing one it is closing
    failed a call in bench_peers, so the client lets idle connections go first."""
    backend = OpenAIBackend(sim.url)
    try:
        await backend.complete(BODY)
        (pool,) = backend._client.origin_pools  # type: ignore[union-attr]
        assert pool.keepalive_s < 5.0
        for connection in pool.idle:  # as if it had waited past the keep-alive
            connection.idle_since -= pool.keepalive_s
        await backend.complete(BODY)
        assert pool.opened == 2
        async with backend._client.stream("POST", backend._request_url, content=b"{}", headers={}):
            pass
        connector = backend._client._session.connector  # type: ignore[union-attr]  # streams: aiohttp's
        assert connector._keepalive_timeout < 5.0  # type: ignore[union-attr]
    finally:
        await backend.aclose()


@pytest.mark.parametrize(
    ("hook", "retry_after_s"),
    [
        ({"status": 429, "retry_after": 7}, 7.0),
        ({"status": 503, "retry_after": 3}, 3.0),
        ({"status": 503}, None),
    ],
)
async def test_retry_after_of_a_refusal_reaches_the_error(
    sim: SimulatorServer, hook: dict[str, int], retry_after_s: float | None
) -> None:
    """The retry policy waits at least what the backend asked: the header must survive the client."""
    async with open_pool() as pool:
        with pytest.raises(BackendHTTPError) as info:
            await pool.get(sim.url).complete({**BODY, "sim": hook})
    assert info.value.status_code == hook["status"]
    assert info.value.retry_after_s == retry_after_s


async def test_retry_after_of_a_rate_limit_at_the_door_reaches_the_error() -> None:
    config = SimulatorConfig(rate_limit_rate=1.0, retry_after_s=5)
    async with SimulatorServer(config) as server, open_pool() as pool:
        with pytest.raises(BackendHTTPError) as info:
            await pool.get(server.url).complete(BODY)
    assert info.value.status_code == 429
    assert info.value.retry_after_s == 5.0


async def test_retry_after_of_a_refused_stream_reaches_the_error(sim: SimulatorServer) -> None:
    async with open_pool() as pool:
        with pytest.raises(BackendHTTPError) as info:
            [c async for c in pool.get(sim.url).stream({**BODY, "sim": {"status": 429, "retry_after": 9}})]
    assert info.value.retry_after_s == 9.0


async def test_a_body_that_trickles_past_the_budget_is_cut_by_it() -> None:
    """Each chunk comes quickly, so only the call's overall budget can end it (no per-read timeout)."""

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            for _ in range(100):
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(0.05)  # not a wait: this is the slow backend
        writer.close()

    server = await asyncio.start_server(trickle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    backend = OpenAIBackend(f"http://127.0.0.1:{port}/v1")
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with pytest.raises(BackendTimeout, match=r"within 0\.3s"):
            await backend.complete(BODY, timeout_s=0.3)
    finally:
        await backend.aclose()
        server.close()
        await server.wait_closed()
    assert 0.25 < loop.time() - started < 2


async def test_a_stream_cut_mid_way_and_a_stream_nobody_answers_are_translated_once() -> None:
    """Over aiohttp (streams): its own errors reach the adapter untranslated and are mapped there once,
    the cause kept: a hang-up after chunks is a mid-call failure, a closed port a connect error."""
    event = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'

    async def half_a_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        writer.write(b"transfer-encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        writer.close()  # no closing chunk: the answer is cut

    server = await asyncio.start_server(half_a_stream, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    backend = OpenAIBackend(f"http://127.0.0.1:{port}/v1")
    chunks: list[dict[str, object]] = []
    try:
        with pytest.raises(BackendError, match="failed mid-call") as cut:
            async for chunk in backend.stream(BODY):
                chunks.append(chunk)
    finally:
        await backend.aclose()
        server.close()
        await server.wait_closed()
    assert len(chunks) == 1 and type(cut.value) is BackendError
    assert isinstance(cut.value.__cause__, aiohttp.ClientError)  # aiohttp's own, mapped at the adapter

    nobody = OpenAIBackend(f"http://127.0.0.1:{port}/v1")  # the server is gone: the port is closed
    try:
        with pytest.raises(BackendConnectError) as refused:
            [c async for c in nobody.stream(BODY)]
    finally:
        await nobody.aclose()
    assert isinstance(refused.value.__cause__, aiohttp.ClientConnectorError)
