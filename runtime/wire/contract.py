"""The wire contract: the canonical chat-completion call, the queued envelope and the reply.

One canonical call shape serves both the direct and the queued path. Encoding is JSON (orjson);
decoding is strict: anything that does not match raises :class:`MalformedEnvelope` saying what is
wrong. The envelope's first field is ``request_id`` so that a truncated or unreadable item still
shows which request it was in logs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

import orjson

from runtime.errors import EnvelopeTooLarge
from runtime.immutable import immutable
from runtime.wire.call import (
    CHAT_COMPLETIONS,
    COMPLETIONS,
    EMBEDDINGS,
    OPTIONAL_CONTENT_ROLES,
    PARAMETER_TYPES,
    PART_TYPES,
    ROLES,
    ChatCall,
)
from runtime.wire.fields import (
    CONTRACT_VERSION,
    MAX_WALL_CLOCK_S,
    MIN_WALL_CLOCK_S,
    _check_str_values,
    _count,
    _expect,
    _fail,
    _load,
    _non_empty_str,
    _wall_clock,
)
from runtime.wire.operations import Call, CompletionsCall, EmbeddingsCall, decode_call
from runtime.wire.reply import (
    STATUS_CHUNK,
    STATUS_ERROR,
    STATUS_OK,
    BackendAnswer,
    Reply,
    StreamChunk,
    Timing,
    decode_reply_item,
)
from runtime.wire.tenant import check_tenant

__all__ = [
    "CHAT_COMPLETIONS",
    "COMPLETIONS",
    "CONTRACT_VERSION",
    "DEFAULT_MAX_ENVELOPE_BYTES",
    "EMBEDDINGS",
    "MAX_WALL_CLOCK_S",
    "MIN_WALL_CLOCK_S",
    "OPTIONAL_CONTENT_ROLES",
    "PARAMETER_TYPES",
    "PART_TYPES",
    "ROLES",
    "STATUS_CHUNK",
    "STATUS_ERROR",
    "STATUS_OK",
    "BackendAnswer",
    "Call",
    "ChatCall",
    "CompletionsCall",
    "EmbeddingsCall",
    "Envelope",
    "Metadata",
    "Reply",
    "StreamChunk",
    "StreamOptions",
    "Timing",
    "decode_reply_item",
    "envelope_prefix",
]

DEFAULT_MAX_ENVELOPE_BYTES = 8 * 1024 * 1024


@immutable
class Metadata:
    """What the scheduler and history need to know about a request besides the call itself."""

    image_count: int = 0
    page_count: int = 0
    cost_units: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Any) -> Metadata:
        if raw is None:
            return cls()
        if type(raw) is dict:  # the common shape, accepted without a check call per field
            image_count, page_count = raw.get("image_count", 0), raw.get("page_count", 0)
            cost_units, labels = raw.get("cost_units"), raw.get("labels", {})
            if (
                type(image_count) is int
                and type(page_count) is int
                and (cost_units is None or type(cost_units) is int)
                and type(labels) is dict
                and image_count >= 0
                and page_count >= 0
                and (cost_units is None or cost_units >= 0)
            ):
                if labels:
                    _check_str_values(labels, "metadata.labels")
                return cls(image_count, page_count, cost_units, labels)
        _expect(raw, dict, "metadata")
        image_count = _expect(raw.get("image_count", 0), int, "metadata.image_count")
        page_count = _expect(raw.get("page_count", 0), int, "metadata.page_count")
        cost_units = raw.get("cost_units")
        if cost_units is not None:
            _expect(cost_units, int, "metadata.cost_units")
        if min(image_count, page_count, cost_units if cost_units is not None else 0) < 0:
            raise _fail("metadata counts must not be negative")
        labels = _expect(raw.get("labels", {}), dict, "metadata.labels")
        _check_str_values(labels, "metadata.labels")
        return cls(image_count=image_count, page_count=page_count, cost_units=cost_units, labels=labels)

    def to_json(self) -> dict[str, Any]:
        return {
            "image_count": self.image_count,
            "page_count": self.page_count,
            "cost_units": self.cost_units,
            "labels": dict(self.labels),
        }


@immutable
class Envelope:
    """One queued request, as it sits in ``list:llm:requests:{pool_id}``."""

    request_id: str
    producer_id: str
    pool_id: str
    call: Call  # its endpoint travels beside it as ``endpoint``, left out for chat (as before)
    enqueued_at: float
    deadline: float | None = None
    trace: Mapping[str, str] = field(default_factory=dict)
    metadata: Metadata = field(default_factory=Metadata)
    stream: StreamOptions | None = None  # set: the dispatcher relays the backend's chunks as they come
    # Which execution this is (1 = first) and how often an expired lease put it back (durable mode).
    attempt: int = 1
    requeues: int = 0
    tenant: str | None = None  # None: untagged traffic, encoded without the field as before issue 22

    def encode(self, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES) -> bytes:
        """Serializes the envelope; refuses one over ``max_bytes`` with EnvelopeTooLarge, and times the
        dispatcher would refuse (out of range) with MalformedEnvelope."""
        _wall_clock(self.enqueued_at, "envelope.enqueued_at")
        if self.deadline is not None:
            _wall_clock(self.deadline, "envelope.deadline")
        optional: dict[str, Any] = {"stream": self.stream.to_json()} if self.stream is not None else {}
        if self.attempt != 1 or self.requeues:
            optional.update(attempt=self.attempt, requeues=self.requeues)
        if self.tenant is not None:
            optional["tenant"] = check_tenant(self.tenant)
        if self.call.endpoint != CHAT_COMPLETIONS:
            optional["endpoint"] = self.call.endpoint
        raw = orjson.dumps(
            {
                "request_id": self.request_id,
                "v": CONTRACT_VERSION,
                "producer_id": self.producer_id,
                "pool_id": self.pool_id,
                "call": self.call.to_openai(),
                "trace": dict(self.trace),
                "enqueued_at": self.enqueued_at,
                "deadline": self.deadline,
                "metadata": self.metadata.to_json(),
                **optional,
            }
        )
        if len(raw) > max_bytes:
            raise EnvelopeTooLarge(
                f"envelope of request {self.request_id} is {len(raw)} bytes, over the limit of {max_bytes}"
            )
        return raw

    @classmethod
    def decode(cls, raw: bytes | str) -> Envelope:
        """Strictly decodes a queued item; raises MalformedEnvelope saying what is wrong."""
        data = _load(raw, "envelope")
        version = data.get("v", CONTRACT_VERSION)
        if version != CONTRACT_VERSION:
            raise _fail(f"envelope version {version!r} is not supported (expected {CONTRACT_VERSION})")
        request_id = _non_empty_str(data.get("request_id"), "envelope.request_id")
        producer_id = _non_empty_str(data.get("producer_id"), "envelope.producer_id")
        pool_id = _non_empty_str(data.get("pool_id"), "envelope.pool_id")
        enqueued_at = _wall_clock(data.get("enqueued_at"), "envelope.enqueued_at")
        deadline = data.get("deadline")
        if deadline is not None:
            deadline = _wall_clock(deadline, "envelope.deadline")
        trace = data.get("trace", {})
        if type(trace) is not dict:
            _expect(trace, dict, "envelope.trace")
        if trace:
            _check_str_values(trace, "envelope.trace")
        attempt = data.get("attempt", 1)
        requeues = data.get("requeues", 0)
        tenant = data.get("tenant")
        endpoint = data.get("endpoint")
        # Chat (no field) skips the endpoint dispatch: every peek of every chat call decodes here.
        call = (
            ChatCall.from_openai(data.get("call"))
            if endpoint is None
            else decode_call(endpoint, data.get("call"))
        )
        stream = data.get("stream")
        if stream is not None and not call.streams:
            raise _fail(f"envelope.stream: the {call.endpoint} endpoint does not stream")
        return cls(
            request_id=request_id,
            producer_id=producer_id,
            pool_id=pool_id,
            call=call,
            enqueued_at=enqueued_at,
            deadline=deadline,
            trace=trace,
            metadata=Metadata.from_json(data.get("metadata")),
            stream=StreamOptions.from_json(stream) if stream is not None else None,
            attempt=1
            if attempt == 1 and type(attempt) is int
            else _count(attempt, "envelope.attempt", minimum=1),
            requeues=0
            if requeues == 0 and type(requeues) is int
            else _count(requeues, "envelope.requeues", minimum=0),
            tenant=None if tenant is None else check_tenant(tenant),
        )


def envelope_prefix(request_id: str, producer_id: str) -> bytes:
    """How every encoded envelope of this request starts, whatever its attempt: a script finds a
    request stored as another attempt's bytes (a retry in the delayed set) by it."""
    return (
        b'{"request_id":' + orjson.dumps(request_id) + b',"v":' + orjson.dumps(CONTRACT_VERSION)
        + b',"producer_id":' + orjson.dumps(producer_id) + b","
    )  # fmt: skip


@immutable
class StreamOptions:
    """A streamed call: ``include_usage`` asks for the final usage-only chunk, as OpenAI's option does."""

    include_usage: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"include_usage": self.include_usage}

    @classmethod
    def from_json(cls, raw: Any) -> StreamOptions:
        _expect(raw, dict, "envelope.stream")
        return cls(
            include_usage=_expect(raw.get("include_usage", False), bool, "envelope.stream.include_usage")
        )
