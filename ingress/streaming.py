"""Server-sent events for ``stream: true``: OpenAI chunks as they arrive, then ``data: [DONE]``.

An error before the first chunk is an ordinary JSON error response with its status code (the SDKs
raise their matching exception); an error after it is an SSE event with OpenAI's error object, which
the SDKs raise while iterating.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import orjson

from ingress.errors import api_error_for
from ingress.http import Send, header_list
from runtime.errors import DispatchError
from runtime.producer import ChatStream

DONE = b"data: [DONE]\n\n"


def sse(data: object) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


async def send_stream(send: Send, stream: ChatStream, headers: Iterable[tuple[str, str]]) -> None:
    """Writes the stream; errors before the first chunk propagate (the caller answers with JSON)."""
    events = aiter(stream)
    async with contextlib.aclosing(events):  # type: ignore[type-var]
        try:
            first = await anext(events)
        except StopAsyncIteration:
            first = None
        queue_wait_ms = (stream.queue_wait_s or 0.0) * 1000
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                    *header_list([*headers, ("x-dispatch-queue-wait-ms", f"{queue_wait_ms:.3f}")]),
                ],
            }
        )
        if first is None:
            await send({"type": "http.response.body", "body": DONE})
            return
        await send({"type": "http.response.body", "body": sse(first), "more_body": True})
        try:
            async for chunk in events:
                await send({"type": "http.response.body", "body": sse(chunk), "more_body": True})
        except DispatchError as exc:
            error = api_error_for(exc)
            body = b"data: " + error.body() + b"\n\n"
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": DONE})
