"""The canonical chat-completion call, validated once when a dispatcher first peeks it.

The other OpenAI operations a queue carries (embeddings, legacy text completions) live beside it in
:mod:`runtime.wire.operations`; every call names its ``endpoint`` (the envelope carries it) and its
GenAI ``operation`` (spans and history name it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import field
from typing import Any, ClassVar

from runtime.immutable import immutable
from runtime.policy.tokens import TokenCount, estimate_tokens
from runtime.wire.fields import _NUMBER, _expect, _fail

# The OpenAI endpoints a queued call may name (the envelope's ``endpoint``; absent means chat, so
# envelopes written before other endpoints existed decode unchanged), with the path appended to a
# backend's base URL and the OpenTelemetry GenAI ``gen_ai.operation.name`` of each.
CHAT_COMPLETIONS = "chat.completions"
EMBEDDINGS = "embeddings"
COMPLETIONS = "completions"
ENDPOINT_PATHS = {
    CHAT_COMPLETIONS: "/chat/completions",
    EMBEDDINGS: "/embeddings",
    COMPLETIONS: "/completions",
}
OPERATIONS = {CHAT_COMPLETIONS: "chat", EMBEDDINGS: "embeddings", COMPLETIONS: "text_completion"}

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
PART_TYPES = frozenset({"text", "image_url", "input_audio", "file", "refusal"})
# Roles whose content the OpenAI API lets be null or absent (a tool or function call, audio, a result).
OPTIONAL_CONTENT_ROLES = frozenset({"assistant", "function"})
# Known OpenAI chat-completion parameters and the JSON types each may take. Anything else is a
# provider extra and passes through untouched.
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


def check_model(body: Any) -> str:
    """The body's ``model``: a non-empty string."""
    _expect(body, dict, "call")
    model: str = _expect(body.get("model"), str, "call.model")
    if not model.strip():
        raise _fail("call.model must not be empty")
    return model


def split_parameters(
    body: Mapping[str, Any], types: Mapping[str, tuple[type, ...]], own: tuple[str, ...]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The body's known parameters (type-checked against ``types``) and its provider extras, leaving
    out the fields ``own`` names (the call's own, checked by the caller)."""
    if body.get("stream"):
        raise _fail("call.stream is not supported on the queued path")
    parameters: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for name, value in body.items():
        if name in own or name == "stream":
            continue
        if name in types:
            if value is not None:
                _expect(value, types[name], f"call.{name}")
                if isinstance(value, float) and not math.isfinite(value):
                    raise _fail(f"call.{name} must be finite")
            parameters[name] = value
        else:
            extra[name] = value
    return parameters, extra


def _check_messages(messages: list[Any]) -> int:
    """Validates every message of a call; returns the number of image parts they carry."""
    images = 0
    for i, message in enumerate(messages):
        # The common message (a known role, text content) is accepted here without building its path.
        if type(message) is dict and type(message.get("content")) is str:
            role = message.get("role")
            if type(role) is str and role in ROLES:
                continue
        images += _check_message(message, f"call.messages[{i}]")
    return images


@immutable
class ChatCall:
    """A normalized OpenAI-compatible chat-completion call (non-streaming).

    ``parameters`` holds the known sampling and tool parameters, type-checked; ``extra`` holds
    provider extras, passed to the backend untouched.
    """

    endpoint: ClassVar[str] = CHAT_COMPLETIONS
    streams: ClassVar[bool] = True  # whether the endpoint can stream

    model: str
    messages: tuple[Mapping[str, Any], ...]
    parameters: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    # Image parts counted while validating (from_openai), so the cost estimate needs no second pass.
    _images: int | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_openai(cls, body: Any) -> ChatCall:
        """Builds a call from an OpenAI chat-completions request body; raises MalformedEnvelope."""
        model = check_model(body)
        messages = _expect(body.get("messages"), list, "call.messages")
        if not messages:
            raise _fail("call.messages must not be empty")
        images = _check_messages(messages)
        parameters, extra = split_parameters(body, PARAMETER_TYPES, ("model", "messages"))
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

    @property
    def operation(self) -> str:
        return OPERATIONS[self.endpoint]

    @property
    def message_count(self) -> int:
        return len(self.messages)

    def tokens(self, default_output_tokens: int) -> TokenCount:
        """The launch-time token estimate (:mod:`runtime.policy.tokens`)."""
        return estimate_tokens(self.messages, self.parameters, default_output_tokens)
