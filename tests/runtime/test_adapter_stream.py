"""OpenAIBackend.stream: SSE parsing and failures translated at the edge (httpx MockTransport)."""

from __future__ import annotations

import httpx
import pytest

from runtime.backends.adapter import OpenAIBackend
from runtime.errors import BackendConnectError, BackendHTTPError, BackendInvalidResponse

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def backend(handler: object) -> OpenAIBackend:
    return OpenAIBackend("http://backend.test/v1", transport=httpx.MockTransport(handler))  # type: ignore[arg-type]


def sse(*events: bytes) -> httpx.Response:
    return httpx.Response(200, content=b"".join(events), headers={"content-type": "text/event-stream"})


async def test_chunks_until_done() -> None:
    seen: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.content)
        return sse(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', b": keep-alive\n\n",
                   b'data: {"choices":[{"delta":{"content":"b"}}]}\n\n', b"data: [DONE]\n\n",
                   b'data: {"after":"done"}\n\n')  # fmt: skip

    chunks = [c async for c in backend(handler).stream(BODY)]
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == ["a", "b"]
    assert b'"stream":true' in seen[0]


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (httpx.Response(429, json={"error": {"message": "slow down"}}), BackendHTTPError),
        (sse(b"data: {not json\n\n"), BackendInvalidResponse),
        (sse(b"data: [1]\n\n"), BackendInvalidResponse),
        (sse(b'data: {"error": {"message": "overloaded"}}\n\n'), BackendHTTPError),
    ],
)
async def test_failures_are_typed(response: httpx.Response, error: type[Exception]) -> None:
    with pytest.raises(error):
        [c async for c in backend(lambda _: response).stream(BODY)]


async def test_connect_failure_is_typed() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(BackendConnectError):
        [c async for c in backend(refuse).stream(BODY)]
