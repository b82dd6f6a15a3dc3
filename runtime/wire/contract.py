"""The wire contract: the canonical chat-completion call, the queued envelope and the reply.

One canonical call shape serves both the direct and the queued path. Encoding is JSON (orjson);
decoding is strict: anything that does not match raises :class:`MalformedEnvelope` saying what is
wrong. The envelope's first field is ``request_id`` so that a truncated or unreadable item still
shows which request it was in logs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from runtime.errors import EnvelopeTooLarge, MalformedEnvelope
from runtime.wire.tenant import check_tenant

CONTRACT_VERSION = 1
DEFAULT_MAX_ENVELOPE_BYTES = 8 * 1024 * 1024

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
PART_TYPES = frozenset({"text", "image_url", "input_audio", "file", "refusal"})
# Roles whose content the OpenAI API lets be null or absent (a tool or function call, audio, a result).
OPTIONAL_CONTENT_ROLES = frozenset({"assistant", "function"})
# Known OpenAI chat-completion parameters and the JSON types each may take. Anything else is a
# provider extra and passes through untouched.
_NUMBER = (int, float)
PARAMETER_TYPES: dict[str, tuple[type, ...]] = {
    "temperature": _NUMBER,
    "top_p": _NUMBER,
    "max_tokens": (int,),
    "max_completion_tokens": (int,),
    "n": (int,),
    "stop": (str, list),
    "seed": (int,),
    "presence_penalty": _NUMBER,
    "frequency_penalty": _NUMBER,
    "logit_bias": (dict,),
    "logprobs": (bool,),
    "top_logprobs": (int,),
    "response_format": (dict,),
    "tools": (list,),
    "tool_choice": (str, dict),
    "parallel_tool_calls": (bool,),
    "user": (str,),
    "reasoning_effort": (str,),
    "metadata": (dict,),
}
STATUS_OK = "ok"
STATUS_ERROR = "error"
STATUS_CHUNK = "chunk"  # one streamed chunk, relayed ahead of the request's final reply

# Wall-clock times an envelope may carry (seconds since the epoch): 1970 to 2100. Anything else is a
# bug or an attack, and would overflow nanosecond span timestamps (int64) downstream.
MIN_WALL_CLOCK_S = 0.0
MAX_WALL_CLOCK_S = 4_102_444_800.0


def _fail(what: str) -> MalformedEnvelope:
    return MalformedEnvelope(what)


def _expect(value: Any, types: tuple[type, ...] | type, what: str) -> Any:
    # bool is an int in Python; a JSON true is never a valid count or number here.
    if type(value) is not bool and isinstance(value, types):
        return value
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise _fail(f"{what} must be {_type_names(types)}, got a boolean")
    if not isinstance(value, types):
        raise _fail(f"{what} must be {_type_names(types)}, got {type(value).__name__}")
    return value


def _type_names(types: tuple[type, ...] | type) -> str:
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
        bool: "a boolean",
    }
    seq = types if isinstance(types, tuple) else (types,)
    return " or ".join(names.get(t, t.__name__) for t in seq)


# Every queued call is validated once, when a dispatcher first peeks it (issue 13). The checks below
# test exact JSON types inline and build the path of a field ("call.messages[0].content") only when
# that field is wrong: _expect then decides, so the accepted values and the messages stay the same.


def _check_part(part: Any, where: str, index: int) -> int:
    """Validates ``where``'s content part ``index``; returns 1 for an image part, else 0."""
    if type(part) is not dict:
        _expect(part, dict, f"{where}.content[{index}]")
    kind = part.get("type")
    if kind == "text":
        if type(part.get("text")) is not str:
            _expect(part.get("text"), str, f"{where}.content[{index}].text")
        return 0
    if kind == "image_url":
        image = part.get("image_url")
        if type(image) is not dict:
            _expect(image, dict, f"{where}.content[{index}].image_url")
        if type(image.get("url")) is not str:
            _expect(image.get("url"), str, f"{where}.content[{index}].image_url.url")
        return 1
    if not isinstance(kind, str) or kind not in PART_TYPES:  # a list or object is unhashable
        raise _fail(f"{where}.content[{index}].type must be one of {sorted(PART_TYPES)}, got {kind!r}")
    return 0


def _check_message(message: Any, where: str) -> int:
    """Validates one chat message; returns the number of image parts it carries."""
    if type(message) is not dict:
        _expect(message, dict, where)
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:  # a list or object is unhashable
        raise _fail(f"{where}.role must be one of {sorted(ROLES)}, got {role!r}")
    content = message.get("content")
    if type(content) is str:
        return 0
    if content is None:
        if role not in OPTIONAL_CONTENT_ROLES:
            raise _fail(f"{where}.content is required")
        return 0
    if isinstance(content, str):
        return 0
    if type(content) is not list:
        _expect(content, list, f"{where}.content")
    images = 0
    for i, part in enumerate(content):
        images += _check_part(part, where, i)
    return images


def _check_messages(messages: list[Any]) -> int:
    """Validates every message of a call; returns the number of image parts they carry."""
    images = 0
    for i, message in enumerate(messages):
        images += _check_message(message, f"call.messages[{i}]")
    return images


@dataclass(frozen=True, slots=True)
class ChatCall:
    """A normalized OpenAI-compatible chat-completion call (non-streaming).

    ``parameters`` holds the known sampling and tool parameters, type-checked; ``extra`` holds
    provider extras, passed to the backend untouched.
    """

    model: str
    messages: tuple[Mapping[str, Any], ...]
    parameters: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    # Image parts counted while validating (from_openai), so the cost estimate needs no second pass.
    _images: int | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_openai(cls, body: Any) -> ChatCall:
        """Builds a call from an OpenAI chat-completions request body; raises MalformedEnvelope."""
        _expect(body, dict, "call")
        model = _expect(body.get("model"), str, "call.model")
        if not model.strip():
            raise _fail("call.model must not be empty")
        messages = _expect(body.get("messages"), list, "call.messages")
        if not messages:
            raise _fail("call.messages must not be empty")
        images = _check_messages(messages)
        if body.get("stream"):
            raise _fail("call.stream is not supported on the queued path")
        parameters: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for name, value in body.items():
            if name in ("model", "messages", "stream"):
                continue
            if name in PARAMETER_TYPES:
                if value is not None:
                    _expect(value, PARAMETER_TYPES[name], f"call.{name}")
                    if isinstance(value, float) and not math.isfinite(value):
                        raise _fail(f"call.{name} must be finite")
                parameters[name] = value
            else:
                extra[name] = value
        call = cls(model=model, messages=tuple(messages), parameters=parameters, extra=extra)
        object.__setattr__(call, "_images", images)  # frozen: set once, right after construction
        return call

    def to_openai(self) -> dict[str, Any]:
        """The request body sent to the backend, provider extras included."""
        body: dict[str, Any] = {"model": self.model, "messages": list(self.messages)}
        body.update(self.parameters)
        body.update(self.extra)
        return body

    @property
    def image_parts(self) -> int:
        if self._images is not None:
            return self._images
        return sum(_check_message(m, "message") for m in self.messages)


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class Envelope:
    """One queued request, as it sits in ``list:llm:requests:{pool_id}``."""

    request_id: str
    producer_id: str
    pool_id: str
    call: ChatCall
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
        trace = _expect(data.get("trace", {}), dict, "envelope.trace")
        _check_str_values(trace, "envelope.trace")
        attempt = data.get("attempt", 1)
        requeues = data.get("requeues", 0)
        tenant = data.get("tenant")
        return cls(
            request_id=request_id,
            producer_id=producer_id,
            pool_id=pool_id,
            call=ChatCall.from_openai(data.get("call")),
            enqueued_at=enqueued_at,
            deadline=deadline,
            trace=trace,
            metadata=Metadata.from_json(data.get("metadata")),
            stream=StreamOptions.from_json(data["stream"]) if data.get("stream") is not None else None,
            attempt=1
            if attempt == 1 and type(attempt) is int
            else _count(attempt, "envelope.attempt", minimum=1),
            requeues=0
            if requeues == 0 and type(requeues) is int
            else _count(requeues, "envelope.requeues", minimum=0),
            tenant=None if tenant is None else check_tenant(tenant),
        )


def _check_str_values(mapping: Mapping[Any, Any], what: str) -> None:
    """Every value of ``mapping`` must be a string; the message names the first key that is not."""
    for key, value in mapping.items():
        if type(value) is not str:
            _expect(value, str, f"{what}[{key!r}]")


def _count(value: Any, what: str, *, minimum: int) -> int:
    count: int = _expect(value, int, what)
    if count < minimum:
        raise _fail(f"{what} must be at least {minimum}, got {count}")
    return count


def _wall_clock(value: Any, what: str) -> float:
    seconds = value if type(value) is float else float(_expect(value, _NUMBER, what))
    if not MIN_WALL_CLOCK_S <= seconds <= MAX_WALL_CLOCK_S:  # also refuses NaN
        raise _fail(
            f"{what} is out of range: {value!r} is not a time between {MIN_WALL_CLOCK_S:.0f} and "
            f"{MAX_WALL_CLOCK_S:.0f} seconds since the epoch"
        )
    return seconds


def envelope_prefix(request_id: str, producer_id: str) -> bytes:
    """How every encoded envelope of this request starts, whatever its attempt: a script finds a
    request stored as another attempt's bytes (a retry in the delayed set) by it."""
    return (
        b'{"request_id":' + orjson.dumps(request_id) + b',"v":' + orjson.dumps(CONTRACT_VERSION)
        + b',"producer_id":' + orjson.dumps(producer_id) + b","
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


def _non_empty_str(value: Any, what: str) -> str:
    if type(value) is not str:
        _expect(value, str, what)
    if not value:
        raise _fail(f"{what} must not be empty")
    return value


def _load(raw: bytes | str, what: str) -> dict[str, Any]:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _fail(f"{what} is not valid JSON: {exc}") from exc
    return _expect(data, dict, what)


@dataclass(frozen=True, slots=True)
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
        values = {
            name: float(_expect(raw.get(name, 0.0), _NUMBER, f"reply.timing.{name}"))
            for name in ("queue_wait_s", "execution_s", "total_s")
        }
        return cls(**values)


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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
