"""The backend adapter: unit tests over httpx.MockTransport, integration tests over the real simulator."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import httpx
import orjson
import pytest

from runtime.backends.adapter import BackendPool, Completion, OpenAIBackend, Usage, parse_usage
from runtime.errors import (
    BackendConnectError,
    BackendError,
    BackendHTTPError,
    BackendInvalidResponse,
    BackendTimeout,
)
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.backend_pool import open_pool

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "m-2024",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "yo"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
}
SECRET = "sup3r-s3cret"


def mock_backend(
    handler: Callable[[httpx.Request], httpx.Response], url: str = "http://backend.test/v1", **kwargs: object
) -> OpenAIBackend:
    return OpenAIBackend(url, transport=httpx.MockTransport(handler), **kwargs)


def raising(exc: Exception) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return handler


async def test_success_sends_body_untouched_and_parses_usage() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=COMPLETION)

    backend = mock_backend(handler, api_key="k-123")
    result = await backend.complete(BODY)
    assert result == Completion(
        body=COMPLETION,
        usage=Usage(input_tokens=7, output_tokens=3, total_tokens=10),
        status_code=200,
        model="m-2024",
    )
    (request,) = seen
    assert request.method == "POST"
    assert str(request.url) == "http://backend.test/v1/chat/completions"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["authorization"] == "Bearer k-123"
    assert orjson.loads(request.content) == BODY
    await backend.aclose()


async def test_no_key_no_authorization_header_and_query_kept() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=COMPLETION)

    backend = mock_backend(handler, url="https://az.test/openai/v1/?api-version=2024-06-01")
    await backend.complete(BODY)
    assert "authorization" not in seen[0].headers
    assert str(seen[0].url) == "https://az.test/openai/v1/chat/completions?api-version=2024-06-01"


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}, Usage(1, 2, 3)),
        ({"prompt_tokens": 1, "completion_tokens": 2}, Usage(1, 2, 3)),
        ({"prompt_tokens": 4}, Usage(4, None, None)),
        ({"input_tokens": 5, "output_tokens": 6}, Usage(5, 6, 11)),
        ({"prompt_tokens": "7", "completion_tokens": True}, None),
        ({}, None),
        (None, None),
        ("lots", None),
    ],
)
def test_parse_usage(usage: object, expected: Usage | None) -> None:
    body = {"choices": []} if usage is None else {"choices": [], "usage": usage}
    assert parse_usage(body) == expected


async def test_missing_usage_gives_none() -> None:
    body = {k: v for k, v in COMPLETION.items() if k != "usage"}
    result = await mock_backend(lambda r: httpx.Response(200, json=body)).complete(BODY)
    assert result.usage is None
    assert result.model == "m-2024"


@pytest.mark.parametrize(
    ("status", "content", "expected_in_message", "retryable"),
    [
        (
            500,
            orjson.dumps({"error": {"message": "engine died", "type": "server_error"}}),
            "engine died",
            True,
        ),
        (429, orjson.dumps({"error": {"message": "slow down"}}), "slow down", True),
        (400, orjson.dumps({"object": "error", "message": "bad max_tokens"}), "bad max_tokens", False),
        (422, orjson.dumps({"detail": "field required"}), "field required", False),
        (401, orjson.dumps({"error": "no key"}), "no key", False),
        (502, b"<html>bad gateway</html>", "bad gateway", True),
        (503, b"", "(empty body)", True),
    ],
)
async def test_non_2xx_is_backend_http_error(
    status: int, content: bytes, expected_in_message: str, retryable: bool
) -> None:
    backend = mock_backend(lambda r: httpx.Response(status, content=content))
    with pytest.raises(BackendHTTPError) as info:
        await backend.complete(BODY)
    assert info.value.status_code == status
    assert info.value.retryable is retryable
    assert expected_in_message in str(info.value)
    assert f"HTTP {status}" in str(info.value)
    assert "http://backend.test/v1" in str(info.value)
    # What an API client may read: the backend's own words, no address.
    assert expected_in_message in info.value.backend_message
    assert "backend.test" not in info.value.backend_message


@pytest.mark.parametrize(
    "content",
    [b"<html>oops</html>", b"", b"[1, 2]", orjson.dumps({"id": "x"}), orjson.dumps({"choices": "nope"})],
)
async def test_2xx_without_chat_completion_is_invalid_response(content: bytes) -> None:
    backend = mock_backend(lambda r: httpx.Response(200, content=content))
    with pytest.raises(BackendInvalidResponse, match=r"http://backend\.test/v1"):
        await backend.complete(BODY)


@pytest.mark.parametrize(
    ("exc", "error_class"),
    [
        (httpx.ConnectError("connection refused"), BackendConnectError),
        (httpx.ConnectTimeout("connect timed out"), BackendConnectError),
        (httpx.ReadTimeout("read timed out"), BackendTimeout),
        (httpx.WriteTimeout("write timed out"), BackendTimeout),
        (httpx.PoolTimeout("pool timed out"), BackendTimeout),
        (httpx.RemoteProtocolError("server disconnected"), BackendError),
        (httpx.ReadError("reset by peer"), BackendError),
    ],
)
async def test_transport_errors_are_classified(exc: Exception, error_class: type[BackendError]) -> None:
    backend = mock_backend(raising(exc))
    with pytest.raises(error_class) as info:
        await backend.complete(BODY)
    assert type(info.value) is error_class
    assert info.value.__cause__ is exc
    assert "http://backend.test/v1" in str(info.value)


async def test_overall_timeout_bounds_the_whole_call() -> None:
    async def slow_handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)  # not a wait: this backend is slow, the call must give up first
        return httpx.Response(200, json=COMPLETION)

    backend = OpenAIBackend("http://backend.test/v1", transport=httpx.MockTransport(slow_handler))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(BackendTimeout, match=r"within 0\.1s"):
        await backend.complete(BODY, timeout_s=0.1)
    assert loop.time() - started < 1
    with pytest.raises(BackendTimeout, match="no time left"):
        await backend.complete(BODY, timeout_s=0)


async def test_userinfo_password_is_bearer_and_never_in_url_or_messages() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(500, json={"error": {"message": "kaput"}})

    backend = mock_backend(handler, url=f"https://user:{SECRET}@backend.test/v1?key={SECRET}")
    assert backend.display_url == "https://backend.test/v1?key=***"
    assert SECRET not in repr(backend)
    with pytest.raises(BackendHTTPError) as info:
        await backend.complete(BODY)
    assert SECRET not in str(info.value)
    assert "https://backend.test/v1?key=***" in str(info.value)
    request = seen[0]
    assert request.headers["authorization"] == f"Bearer {SECRET}"
    assert request.url.userinfo == b""
    assert "user" not in str(request.url)


async def test_explicit_api_key_wins_over_userinfo() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=COMPLETION)

    await mock_backend(handler, url=f"https://u:{SECRET}@backend.test/v1", api_key="explicit").complete(BODY)
    assert seen[0].headers["authorization"] == "Bearer explicit"


async def test_pool_shares_one_client_per_endpoint() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.headers.get("authorization", ""))
        return httpx.Response(200, json=COMPLETION)

    pool = BackendPool(api_keys={"http://a.test/v1": "key-a"}, transport=httpx.MockTransport(handler))
    a1 = pool.get("http://a.test/v1")
    assert pool.get("http://a.test/v1") is a1
    a2 = pool.get("http://a.test/v1", api_key="other")
    b = pool.get("http://b.test/v1")
    assert a2 is not a1
    assert a1._client is a2._client
    assert b._client is not a1._client
    await a1.complete(BODY)
    await a2.complete(BODY)
    await b.complete(BODY)
    assert calls == ["Bearer key-a", "Bearer other", ""]
    assert "clients=2" in repr(pool)
    await a1.aclose()  # shared client: closing one backend leaves the pool's client open
    await a2.complete(BODY)
    await pool.aclose()
    assert a1._client.is_closed
    with pytest.raises(TypeError, match="unknown BackendPool options"):
        BackendPool(timeout=3)


# -- integration against the real simulator ---------------------------------------------------------


@pytest.fixture
async def sim():
    async with SimulatorServer(SimulatorConfig(model="sim-int")) as server:
        yield server


async def test_real_success_with_usage(sim: SimulatorServer) -> None:
    backend = OpenAIBackend(sim.url)
    try:
        result = await backend.complete(BODY)
    finally:
        await backend.aclose()
    assert result.status_code == 200
    assert result.model == "m"
    assert result.usage is not None
    assert result.usage.output_tokens == 5
    assert result.usage.total_tokens == result.usage.input_tokens + 5
    assert result.body["choices"][0]["message"]["role"] == "assistant"


async def test_real_500_carries_provider_message(sim: SimulatorServer) -> None:
    async with open_pool() as pool:
        backend = pool.get(sim.url)
        with pytest.raises(BackendHTTPError, match="the GPU melted") as info:
            await backend.complete({**BODY, "sim": {"status": 500, "message": "the GPU melted"}})
    assert info.value.status_code == 500
    assert info.value.retryable


async def test_real_slow_call_times_out(sim: SimulatorServer) -> None:
    async with open_pool() as pool:
        with pytest.raises(BackendTimeout):
            await pool.get(sim.url).complete({**BODY, "sim": {"latency_ms": 2000}}, timeout_s=0.2)
    assert sim.completions_requested == 1


async def test_real_read_timeout_from_default_timeout(sim: SimulatorServer) -> None:
    backend = OpenAIBackend(sim.url, timeout_s=0.2)
    try:
        with pytest.raises(BackendTimeout):
            await backend.complete({**BODY, "sim": {"latency_ms": 2000}})
    finally:
        await backend.aclose()


async def test_real_garbage_body_is_invalid_response(sim: SimulatorServer) -> None:
    async with open_pool() as pool:
        with pytest.raises(BackendInvalidResponse, match="not JSON"):
            await pool.get(sim.url).complete({**BODY, "sim": {"invalid_body": True}})


async def test_closed_port_is_connect_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://admin:{SECRET}@127.0.0.1:{port}/v1?api_key={SECRET}"
    backend = OpenAIBackend(url)
    try:
        with pytest.raises(BackendConnectError) as info:
            await backend.complete(BODY)
    finally:
        await backend.aclose()
    assert info.value.retryable
    assert f"127.0.0.1:{port}" in str(info.value)
    assert SECRET not in str(info.value)
    assert SECRET not in backend.display_url


async def test_real_credentials_never_leak(sim: SimulatorServer) -> None:
    url = sim.url.replace("http://", f"http://admin:{SECRET}@") + f"?token={SECRET}"
    async with open_pool() as pool:
        backend = pool.get(url)
        assert SECRET not in backend.display_url
        assert SECRET not in repr(pool)
        errors: list[BackendError] = []
        for sim_hook in ({"status": 503}, {"invalid_body": True}, {"latency_ms": 1000}):
            try:
                await backend.complete({**BODY, "sim": sim_hook}, timeout_s=0.2)
            except BackendError as exc:
                errors.append(exc)
        assert [type(e) for e in errors] == [BackendHTTPError, BackendInvalidResponse, BackendTimeout]
        for error in errors:
            assert SECRET not in str(error)
            assert "?token=***" in str(error)
        result = await backend.complete(BODY)
        assert result.usage is not None
