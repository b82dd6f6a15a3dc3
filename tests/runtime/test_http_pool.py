"""The lean HTTP/1.1 pool behind whole POSTs, against real servers over TCP: the simulator, and small
hand-made servers for the answers the simulator never gives (no length, a hang-up, a slow body)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from runtime.backends.adapter import OpenAIBackend
from runtime.backends.http.client import BackendHttpClient
from runtime.backends.http.errors import ConnectFailed, PoolWaitTimeout
from runtime.errors import BackendConnectError, BackendError, BackendTimeout, InvalidHeader
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.waiting import wait_until

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
OK_JSON = b'{"model": "m", "choices": [{"message": {"role": "assistant", "content": "hi"}}]}'
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP server on a free port running ``handler`` per connection; yields its /v1 URL and a list
    that grows by one per accepted connection."""
    accepted: list[int] = []

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    srv = await asyncio.start_server(counted, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/v1", accepted
    finally:
        srv.close()
        await srv.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


async def test_many_concurrent_calls_share_at_most_max_connections() -> None:
    async with SimulatorServer(SimulatorConfig(latency_ms=20)) as sim:
        backend = OpenAIBackend(sim.url, max_connections=4)
        try:
            answers = await asyncio.gather(*(backend.complete(BODY) for _ in range(40)))
            (pool,) = backend._client.origin_pools  # type: ignore[union-attr]
            assert pool.opened == 4
        finally:
            await backend.aclose()
    assert all(a.status_code == 200 and a.body["choices"] for a in answers)


async def test_the_request_is_what_an_http_server_expects() -> None:
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(OK_JSON), OK_JSON)
        )
        await writer.drain()

    async with server(answer) as (url, _):
        backend = OpenAIBackend(url + "?api-version=2", api_key="sk-secret")
        try:
            await backend.complete(BODY)
        finally:
            await backend.aclose()
    head, body = seen[0].split(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions?api-version=2 HTTP/1.1"
    headers = dict(line.lower().split(b": ", 1) for line in lines[1:])
    assert headers[b"host"].startswith(b"127.0.0.1:")
    assert headers[b"authorization"] == b"bearer sk-secret"
    assert int(headers[b"content-length"]) == len(body) and body.startswith(b'{"model":"m"')


async def test_an_answer_without_length_ends_with_the_connection_and_is_not_reused() -> None:
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" + OK_JSON
        )
        await writer.drain()

    async with server(until_close) as (url, accepted):
        backend = OpenAIBackend(url)
        try:
            first = await backend.complete(BODY)
            second = await backend.complete(BODY)
        finally:
            await backend.aclose()
    assert first.body["choices"] and second.body["choices"]
    assert len(accepted) == 2


async def test_a_chunked_answer_is_joined() -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            half = len(OK_JSON) // 2
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for part in (OK_JSON[:half], OK_JSON[half:]):
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async with server(chunked) as (url, accepted):
        backend = OpenAIBackend(url)
        try:
            answers = [await backend.complete(BODY) for _ in range(3)]
        finally:
            await backend.aclose()
    assert all(a.body["choices"][0]["message"]["content"] == "hi" for a in answers)
    assert len(accepted) == 1  # kept alive across answers


async def test_an_idle_connection_the_server_closed_is_not_used_again() -> None:
    async def one_answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(OK_JSON), OK_JSON))
        await writer.drain()  # keep-alive was promised, but the server closes the idle connection

    async with server(one_answer_then_close) as (url, accepted):
        backend = OpenAIBackend(url)
        try:
            await backend.complete(BODY)
            (pool,) = backend._client.origin_pools  # type: ignore[union-attr]
            # The server's close reaches the connection while it is idle in the pool.
            await wait_until(lambda: pool.idle and pool.idle[0].closed, timeout=5, what="the idle close")
            await backend.complete(BODY)
        finally:
            await backend.aclose()
    assert len(accepted) == 2


async def test_a_hang_up_after_the_request_is_not_a_connect_error_and_is_not_resent() -> None:
    async def read_then_hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with server(read_then_hang_up) as (url, accepted):
        backend = OpenAIBackend(url)
        try:
            with pytest.raises(BackendError, match="failed mid-call") as info:
                await backend.complete(BODY)
        finally:
            await backend.aclose()
    assert not isinstance(info.value, BackendConnectError)
    assert len(accepted) == 1  # the backend may have run it: never sent twice


async def test_a_slow_answer_is_cut_by_the_budget_and_the_pool_recovers() -> None:
    calls = 0

    async def slow_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal calls
        while True:
            await read_request(reader)
            calls += 1
            if calls == 1:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(OK_JSON), OK_JSON[:5]))
                await writer.drain()
                with contextlib.suppress(ConnectionError):  # the rest never comes: until the client gives up
                    await reader.read()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(OK_JSON), OK_JSON))
            await writer.drain()

    async with server(slow_first) as (url, accepted):
        backend = OpenAIBackend(url)
        try:
            with pytest.raises(BackendTimeout):
                await backend.complete(BODY, timeout_s=0.3)
            assert (await backend.complete(BODY)).body["choices"]  # on a fresh connection
        finally:
            await backend.aclose()
    assert len(accepted) == 2


async def test_nothing_listening_is_a_connect_error() -> None:
    async with server(read_request) as (url, _):
        pass  # closed again: the port is free now
    backend = OpenAIBackend(url)
    try:
        with pytest.raises(BackendConnectError):
            await backend.complete(BODY)
    finally:
        await backend.aclose()


async def test_a_malformed_answer_is_a_backend_error() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()

    async with server(garbage) as (url, _):
        backend = OpenAIBackend(url)
        try:
            with pytest.raises(BackendError, match="failed mid-call"):
                await backend.complete(BODY)
        finally:
            await backend.aclose()


async def test_an_https_endpoint_is_called_over_tls(tmp_path) -> None:
    """A self-signed certificate for 127.0.0.1, trusted by the client's context: the lean pool does
    the TLS handshake and checks the name, like aiohttp's pool."""
    import ssl
    import subprocess

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(OK_JSON), OK_JSON))
            await writer.drain()

    srv = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_context)
    url = f"https://127.0.0.1:{srv.sockets[0].getsockname()[1]}/v1/chat/completions"
    client = BackendHttpClient(ssl_context=ssl.create_default_context(cafile=str(cert)))
    untrusting = BackendHttpClient(ssl_context=ssl.create_default_context())
    try:
        answers = [await client.post(url, content=b"{}", headers={}) for _ in range(2)]
        assert [a.status_code for a in answers] == [200, 200] and answers[1].content == OK_JSON
        (pool,) = client.origin_pools
        assert pool.opened == 1
        with pytest.raises(ConnectFailed) as refused:  # a certificate it cannot verify is refused
            await untrusting.post(url, content=b"{}", headers={})
        assert isinstance(refused.value.__cause__, ssl.SSLCertVerificationError)
    finally:
        await client.aclose()
        await untrusting.aclose()
        srv.close()
        await srv.wait_closed()


async def test_a_call_in_flight_when_the_client_closes_ends_and_leaves_no_connection_open() -> None:
    async with SimulatorServer(SimulatorConfig(latency_ms=1000)) as sim:
        backend = OpenAIBackend(sim.url)
        call = asyncio.create_task(backend.complete(BODY))
        await wait_until(lambda: sim.running == 1, timeout=5, what="the call running")  # answer not yet back
        (pool,) = backend._client.origin_pools  # type: ignore[union-attr]
        await backend.aclose()
        assert (await call).status_code == 200
        assert pool.idle == ()  # not kept for reuse by a closed client


async def test_a_call_that_waits_for_a_free_connection_past_the_pool_timeout_is_a_backend_timeout() -> None:
    """One connection, busy with a slow call: the second call gives up after the pool timeout (not its
    whole budget) with the adapter's typed pool-timeout error; the first call is not disturbed."""
    async with SimulatorServer(SimulatorConfig()) as sim:
        backend = OpenAIBackend(sim.url, max_connections=1, pool_timeout_s=0.2, timeout_s=30)
        try:
            slow = asyncio.create_task(backend.complete({**BODY, "sim": {"latency_ms": 1500}}))
            await wait_until(lambda: backend._client.origin_pools, what="the slow call holds the connection")  # type: ignore[union-attr]
            (pool,) = backend._client.origin_pools  # type: ignore[union-attr]
            await wait_until(lambda: pool.saturated, what="the only connection is taken")
            with pytest.raises(BackendTimeout, match="no free connection") as info:
                await backend.complete(BODY)
            assert not slow.done()  # it gave up while the connection was still busy, not after
            assert isinstance(info.value.__cause__, PoolWaitTimeout)
            assert "0.2s" in str(info.value) and info.value.retryable
            assert (await slow).status_code == 200
            assert pool.opened == 1
        finally:
            await backend.aclose()


async def test_a_key_or_header_with_a_line_break_is_refused_before_anything_is_written() -> None:
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(OK_JSON), OK_JSON))
        await writer.drain()

    injected = "sk-1\r\nx-injected: yes"
    async with server(answer) as (url, accepted):
        with pytest.raises(InvalidHeader, match="'authorization' has a control character") as info:
            OpenAIBackend(url, api_key=injected)
        assert injected not in str(info.value)  # a credential is not quoted back
        client = BackendHttpClient()
        try:
            for name, value in [("x-extra", "a\r\nx-injected: yes"), ("x-extra", "a\nb"), ("x-extra", "a\0"),
                                ("x-bad name", "v"), ("x-bad:name", "v"), ("", "v")]:  # fmt: skip
                with pytest.raises(InvalidHeader):
                    await client.post(url + "/chat/completions", content=b"{}", headers={name: value})
                with pytest.raises(InvalidHeader):
                    async with client.stream(
                        "POST", url + "/chat/completions", content=b"{}", headers={name: value}
                    ):
                        pass
            assert accepted == []  # nothing was written: not even a connection was opened
            ok = await client.post(url + "/chat/completions", content=b"{}", headers={"x-extra": "a b\tc"})
        finally:
            await client.aclose()
    assert ok.status_code == 200
    assert len(seen) == 1 and b"x-injected" not in seen[0].lower()
