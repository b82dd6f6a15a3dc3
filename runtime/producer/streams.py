"""A streamed call: the chunks a dispatcher relays through the producer's reply list, as they come.

Leaving the loop early (or cancelling it) withdraws the request like a cancelled ``submit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from runtime.errors import DispatchError, MalformedEnvelope, QueueFull, RequestTimeout
from runtime.policy.admission import KeyLimits
from runtime.producer.outcomes import fail_span, refused_span, reply_error, withdrawn_span
from runtime.producer.tenancy import UNTAGGED_TAG, TenantTag, tag_span
from runtime.wire.contract import (
    Call,
    ChatCall,
    CompletionsCall,
    Metadata,
    Reply,
    StreamChunk,
    StreamOptions,
    Timing,
)

if TYPE_CHECKING:
    from runtime.producer.core import Producer

__all__ = ["ChatStream", "stream_call", "stream_events"]


@dataclass(slots=True)
class ChatStream:
    """One streamed call: iterate it for the chunks; ``queue_wait_s`` is known from the first chunk on,
    ``timing`` once the stream ended."""

    producer: Producer
    call: ChatCall | CompletionsCall
    pool_id: str
    metadata: Metadata
    timeout_s: float
    request_id: str
    include_usage: bool = False
    key: KeyLimits | None = None
    tag: TenantTag = UNTAGGED_TAG
    queue_wait_s: float | None = None
    timing: Timing | None = None

    def __aiter__(self) -> AsyncIterator[Mapping[str, Any]]:
        return stream_events(self.producer, self)


def stream_call(
    call: Call | Mapping[str, Any],
    include_usage: bool | None,
    kind: type[ChatCall | CompletionsCall] = ChatCall,
) -> tuple[ChatCall | CompletionsCall, bool]:
    """The call to stream, and whether the client asked for the usage chunk: ``call`` may be the SDK's
    streaming params as they are (their ``stream_options.include_usage`` counts unless
    ``include_usage`` says otherwise); a mapping is read as a ``kind`` call. An embeddings call does
    not stream (MalformedEnvelope)."""
    if isinstance(call, ChatCall | CompletionsCall):
        return call, bool(include_usage)
    if not isinstance(call, Mapping):
        raise MalformedEnvelope(f"call: the {call.endpoint} endpoint does not stream")
    if include_usage is None:
        options = call.get("stream_options")
        include_usage = isinstance(options, Mapping) and options.get("include_usage") is True
    # ``stream`` is the switch: the body's own OpenAI streaming fields are not needed.
    body = {k: v for k, v in call.items() if k not in ("stream", "stream_options")}
    return kind.from_openai(body), bool(include_usage)


async def stream_events(producer: Producer, stream: ChatStream) -> AsyncIterator[Mapping[str, Any]]:
    pool_id, request_id = stream.pool_id, stream.request_id
    producer.stats.submitted += 1
    backend = producer.direct_backend or await producer._route(pool_id)
    if backend is not None:
        body = {**stream.call.to_openai(), "stream_options": {"include_usage": stream.include_usage}}
        with producer._direct.slot(stream.key, pool_id):
            chunks_of = backend.stream(body, endpoint=stream.call.endpoint)
            async with contextlib.aclosing(chunks_of) as chunks:  # type: ignore[type-var]
                async for chunk in chunks:
                    yield chunk
        producer.stats.completed += 1
        return
    span = producer._submit_span(request_id, pool_id, stream.call.model, stream.metadata)
    tag_span(span, stream.tag)
    try:
        async with contextlib.aclosing(_queued_stream(producer, stream, span)) as events:  # type: ignore[type-var]
            async for event in events:
                yield event
    except QueueFull as exc:
        producer.stats.rejected += 1
        refused_span(span, exc)
        raise
    except DispatchError as exc:
        fail_span(span, exc)
        raise
    finally:
        span.end()


async def _queued_stream(
    producer: Producer, stream: ChatStream, span: trace.Span
) -> AsyncIterator[Mapping[str, Any]]:
    pool_id, request_id = stream.pool_id, stream.request_id
    raw = producer._enqueue.envelope(
        stream.call, request_id, pool_id, stream.metadata, stream.timeout_s, span,
        StreamOptions(include_usage=stream.include_usage), tenant=stream.tag.tenant,
    )  # fmt: skip
    lease = producer._enqueue.lease(stream.key, pool_id, request_id, stream.timeout_s)
    inbox: asyncio.Queue[Reply | StreamChunk] = asyncio.Queue()
    producer._replies.streams[request_id] = inbox
    finished = pushed = False
    try:
        await producer._enqueue.push(pool_id, request_id, raw, lease, stream.timeout_s, stream.tag)
        pushed = True
        deadline = time.monotonic() + stream.timeout_s
        while True:
            try:
                # Not asyncio.wait_for: on Python 3.11 it returns a chunk that arrived in the same loop
                # turn as a cancellation and drops the cancellation, so a client that left mid-stream
                # kept its backend call running.
                async with asyncio.timeout(deadline - time.monotonic()):
                    item = await inbox.get()
            except TimeoutError:
                producer.stats.timed_out += 1
                raise RequestTimeout(
                    f"streamed request {request_id} to pool {pool_id!r} did not finish within "
                    f"{stream.timeout_s:g}s"
                ) from None
            if isinstance(item, StreamChunk):
                if item.queue_wait_s is not None:
                    stream.queue_wait_s = item.queue_wait_s
                yield item.chunk
                continue
            finished = True
            stream.timing = item.timing
            if not item.ok:
                producer.stats.failed += 1
                raise reply_error(item)
            producer.stats.completed += 1
            return
    finally:
        producer._replies.streams.pop(request_id, None)
        if pushed and not finished and await producer.withdraw(pool_id, request_id, raw, stream.tag):
            withdrawn_span(span)
        if lease is not None:
            await producer._key_leases.release(lease)
