"""Bare ASGI HTTP helpers of the ingress: read a bounded body, send JSON, wait for a disconnect."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson

from ingress.errors import ApiError

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ClientGone(Exception):
    """The client disconnected before its request body arrived."""


def request_headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


async def read_body(receive: Receive, headers: dict[str, str], max_bytes: int) -> bytes:
    """The whole request body; 413 as soon as it is known to exceed ``max_bytes``."""
    too_large = ApiError(
        413,
        f"the request body exceeds the limit of {max_bytes} bytes",
        "invalid_request_error",
        "request_too_large",
    )
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise too_large
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def header_list(extra: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra]


async def send_json(
    send: Send, status: int, body: bytes | Any, headers: Iterable[tuple[str, str]] = ()
) -> None:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(content)).encode()),
                *header_list(headers),
            ],
        }
    )
    await send({"type": "http.response.body", "body": content})


async def send_error(send: Send, error: ApiError, headers: Iterable[tuple[str, str]] = ()) -> None:
    extra = list(headers)
    if error.retry_after_s is not None:
        extra.append(("retry-after", str(max(1, round(error.retry_after_s)))))
    await send_json(send, error.status, error.body(), extra)
