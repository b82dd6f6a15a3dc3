"""What goes back to a producer: the final reply and the streamed chunks ahead of it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

import orjson

from runtime.immutable import immutable
from runtime.wire.fields import _NUMBER, CONTRACT_VERSION, _expect, _fail, _load, _non_empty_str

STATUS_OK = "ok"
STATUS_ERROR = "error"
STATUS_CHUNK = "chunk"  # one streamed chunk, relayed ahead of the request's final reply


@immutable
class StreamChunk:
    """One chunk of a streamed completion on its way to the producer (OpenAI's chunk object as is).

    The first chunk of a request also carries its queue wait.
    """

    request_id: str
    chunk: Mapping[str, Any]
    queue_wait_s: float | None = None

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "request_id": self.request_id,
                "v": CONTRACT_VERSION,
                "status": STATUS_CHUNK,
                "chunk": self.chunk,
                "queue_wait_s": self.queue_wait_s,
            }
        )


def decode_reply_item(raw: bytes | str) -> Reply | StreamChunk:
    """An item of a reply list: a final :class:`Reply` or a :class:`StreamChunk`."""
    data = _load(raw, "reply")
    if data.get("status") != STATUS_CHUNK:
        return Reply.from_json(data)
    queue_wait = data.get("queue_wait_s")
    return StreamChunk(
        _non_empty_str(data.get("request_id"), "chunk.request_id"),
        _expect(data.get("chunk"), dict, "chunk.chunk"),
        float(_expect(queue_wait, _NUMBER, "chunk.queue_wait_s")) if queue_wait is not None else None,
    )


_TIMING_FIELDS = tuple((name, f"reply.timing.{name}") for name in ("queue_wait_s", "execution_s", "total_s"))


@immutable
class Timing:
    """Seconds spent waiting in the queue, executing against the backend, and in all."""

    queue_wait_s: float = 0.0
    execution_s: float = 0.0
    total_s: float = 0.0

    def to_json(self) -> dict[str, float]:
        return {"queue_wait_s": self.queue_wait_s, "execution_s": self.execution_s, "total_s": self.total_s}

    @classmethod
    def from_json(cls, raw: Any) -> Timing:
        _expect(raw, dict, "reply.timing")
        get = raw.get
        # Every reply has one: the three fields' error labels are built once, not per reply.
        return cls(*(float(_expect(get(name, 0.0), _NUMBER, label)) for name, label in _TIMING_FIELDS))


@immutable
class BackendAnswer:
    """A backend's failed HTTP answer as a reply carries it: its status, its ``Retry-After`` and its
    own message (never its address), so an API client can be shown what the backend said."""

    status: int
    message: str = ""
    retry_after_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "message": self.message, "retry_after_s": self.retry_after_s}

    @classmethod
    def from_json(cls, raw: Any) -> BackendAnswer:
        _expect(raw, dict, "reply.backend")
        status = _expect(raw.get("status"), int, "reply.backend.status")
        message = _expect(raw.get("message", ""), str, "reply.backend.message")
        retry_after = raw.get("retry_after_s")
        if retry_after is not None:
            retry_after = float(_expect(retry_after, _NUMBER, "reply.backend.retry_after_s"))
        return cls(status, message, retry_after)


@immutable
class Reply:
    """The answer routed back to ``list:llm:replies:{producer_id}``; ``backend`` only when a backend's
    HTTP answer was the error."""

    request_id: str
    status: str
    completion: Mapping[str, Any] | None = None
    error_type: str | None = None
    error_message: str | None = None
    timing: Timing = field(default_factory=Timing)
    backend: BackendAnswer | None = None

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    def encode(self) -> bytes:
        data: dict[str, Any] = {
            "request_id": self.request_id,
            "v": CONTRACT_VERSION,
            "status": self.status,
            "completion": self.completion,
            "error_type": self.error_type,
            "error_message": self.error_message,
            "timing": self.timing.to_json(),
        }
        if self.backend is not None:
            data["backend"] = self.backend.to_json()
        return orjson.dumps(data)

    @classmethod
    def decode(cls, raw: bytes | str) -> Reply:
        return cls.from_json(_load(raw, "reply"))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Reply:
        """A reply from its parsed JSON object, validated as :meth:`decode` validates the bytes."""
        request_id = _non_empty_str(data.get("request_id"), "reply.request_id")
        status = data.get("status")
        if status == STATUS_OK:
            completion = _expect(data.get("completion"), dict, "reply.completion")
            timing = Timing.from_json(data.get("timing", {}))
            return cls(request_id, status, completion=completion, timing=timing)
        if status == STATUS_ERROR:
            error_type = _non_empty_str(data.get("error_type"), "reply.error_type")
            message = data.get("error_message") or ""
            _expect(message, str, "reply.error_message")
            backend = data.get("backend")
            return cls(
                request_id,
                status,
                error_type=error_type,
                error_message=message,
                timing=Timing.from_json(data.get("timing", {})),
                backend=BackendAnswer.from_json(backend) if backend is not None else None,
            )
        raise _fail(f"reply.status must be {STATUS_OK!r} or {STATUS_ERROR!r}, got {status!r}")
