"""The queued calls besides chat: embeddings and legacy text completions, and the one decoder of all three.

Each validates an OpenAI request body once, the way :class:`~runtime.wire.call.ChatCall` does: the
call's own field (``input``, ``prompt``) checked, the known parameters type-checked, provider extras
passed to the backend untouched. An envelope names its call's ``endpoint``; :func:`decode_call` picks
the class by it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any, ClassVar, Self

from runtime.immutable import immutable
from runtime.policy.tokens import MAX_TOKENS, TokenCount, estimate_input_tokens, estimate_output_tokens
from runtime.wire.call import (
    CHAT_COMPLETIONS,
    COMPLETIONS,
    EMBEDDINGS,
    OPERATIONS,
    ChatCall,
    check_model,
    split_parameters,
)
from runtime.wire.fields import _NUMBER, _expect, _fail

__all__ = [
    "ENCODING_FORMATS",
    "ENDPOINTS",
    "MAX_DIMENSIONS",
    "MAX_INPUTS",
    "Call",
    "CompletionsCall",
    "EmbeddingsCall",
    "decode_call",
]

# OpenAI's caps: 2048 inputs per embeddings request; no model it serves has more than 3072 dimensions,
# and this bound only keeps a hostile ``dimensions`` from asking a backend for gigabytes.
MAX_INPUTS = 2048
MAX_DIMENSIONS = 65_536
ENCODING_FORMATS = ("float", "base64")

EMBEDDING_PARAMETERS: dict[str, tuple[type, ...]] = {
    "dimensions": (int,),
    "encoding_format": (str,),
    "user": (str,),
}
COMPLETION_PARAMETERS: dict[str, tuple[type, ...]] = {
    "max_tokens": (int,),
    "temperature": _NUMBER,
    "top_p": _NUMBER,
    "n": (int,),
    "best_of": (int,),
    "stop": (str, list),
    "seed": (int,),
    "presence_penalty": _NUMBER,
    "frequency_penalty": _NUMBER,
    "logit_bias": (dict,),
    "logprobs": (int,),  # the legacy API's logprobs is a count, not chat's boolean
    "echo": (bool,),
    "suffix": (str,),
    "user": (str,),
}


def _check_inputs(value: Any, what: str, *, allow_empty_text: bool) -> int:
    """An ``input``/``prompt``: a string, or a non-empty list of strings, of token ids, or of non-empty
    token-id lists (OpenAI's four forms); returns how many inputs it holds."""
    if type(value) is str:
        if not value and not allow_empty_text:
            raise _fail(f"{what} must not be empty")
        return 1
    items = _expect(value, (str, list), what)
    if not items:
        raise _fail(f"{what} must not be empty")
    if len(items) > MAX_INPUTS:
        raise _fail(f"{what} holds {len(items)} items, over the limit of {MAX_INPUTS}")
    kind = type(items[0])
    if kind not in (str, int, list):
        raise _fail(f"{what} must be a string or a list of strings, token ids or token-id lists")
    for i, item in enumerate(items):
        if type(item) is not kind:
            raise _fail(f"{what}[{i}] must be {_form(kind)} like {what}[0]")
        _check_item(item, f"{what}[{i}]", allow_empty_text)
    return 1 if kind is int else len(items)


def _check_item(item: str | int | list[Any], what: str, allow_empty_text: bool) -> None:
    if isinstance(item, str):
        if not item and not allow_empty_text:
            raise _fail(f"{what} must not be empty")
    elif isinstance(item, int):
        if item < 0:
            raise _fail(f"{what} must be a token id >= 0")
    elif not item:
        raise _fail(f"{what} must not be empty")
    elif any(type(t) is not int or t < 0 for t in item):
        raise _fail(f"{what} must hold token ids (integers >= 0)")


def _form(kind: type) -> str:
    return {str: "a string", int: "a token id", list: "a token-id list"}[kind]


class _TextCall:
    """What the two calls besides chat share: a model, one text field (``input`` or ``prompt``, in any of
    OpenAI's four forms), the known parameters, and provider extras passed through untouched."""

    __slots__ = ()

    endpoint: ClassVar[str]
    text_field: ClassVar[str]  # the request body's field this call carries, and its attribute
    model: str
    parameters: Mapping[str, Any]
    extra: Mapping[str, Any]
    _count: int  # how many inputs or prompts the text holds

    @classmethod
    def from_openai(cls, body: Any) -> Self:
        raise NotImplementedError

    @classmethod
    def of(cls, call: Self | Mapping[str, Any]) -> Self:
        """The call itself, or one built from its request body."""
        return call if isinstance(call, cls) else cls.from_openai(call)

    @classmethod
    def _parse(
        cls, body: Any, known: dict[str, tuple[type, ...]], *, allow_empty_text: bool, required: bool = False
    ) -> tuple[str, str | tuple[Any, ...], Mapping[str, Any], Mapping[str, Any], int]:
        """The checked model, text, parameters, extras and text count, in the order the fields stand."""
        model = check_model(body)
        name = cls.text_field
        raw = body.get(name)
        if required and raw is None:
            raise _fail(f"call.{name} is required")
        count = _check_inputs(raw, f"call.{name}", allow_empty_text=allow_empty_text)
        parameters, extra = split_parameters(body, known, ("model", name))
        return model, raw if isinstance(raw, str) else tuple(raw), parameters, extra, count

    def to_openai(self) -> dict[str, Any]:
        text = getattr(self, self.text_field)
        body: dict[str, Any] = {
            "model": self.model,
            self.text_field: text if isinstance(text, str) else list(text),
        }
        body.update(self.parameters)
        body.update(self.extra)
        return body

    @property
    def operation(self) -> str:
        return OPERATIONS[self.endpoint]

    @property
    def message_count(self) -> int:
        """How many inputs the call embeds, or prompts it completes (history's message count)."""
        return self._count

    @property
    def image_parts(self) -> int:
        return 0


@immutable
class EmbeddingsCall(_TextCall):
    """A normalized ``POST /v1/embeddings`` call. It costs its input: an embedding has no output tokens."""

    endpoint: ClassVar[str] = EMBEDDINGS
    streams: ClassVar[bool] = False
    text_field: ClassVar[str] = "input"

    model: str
    input: str | tuple[Any, ...]
    parameters: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    _count: int = field(default=1, repr=False, compare=False)

    @classmethod
    def from_openai(cls, body: Any) -> EmbeddingsCall:
        """Builds a call from an OpenAI embeddings request body; raises MalformedEnvelope."""
        call = cls(*cls._parse(body, EMBEDDING_PARAMETERS, allow_empty_text=False))
        dimensions = call.parameters.get("dimensions")
        if dimensions is not None and not 1 <= dimensions <= MAX_DIMENSIONS:
            raise _fail(f"call.dimensions must be between 1 and {MAX_DIMENSIONS}, got {dimensions}")
        encoding = call.parameters.get("encoding_format")
        if encoding is not None and encoding not in ENCODING_FORMATS:
            raise _fail(f"call.encoding_format must be one of {list(ENCODING_FORMATS)}, got {encoding!r}")
        return call

    def tokens(self, default_output_tokens: int) -> TokenCount:
        return TokenCount(estimate_input_tokens(self.input), 0)


@immutable
class CompletionsCall(_TextCall):
    """A normalized legacy ``POST /v1/completions`` call (text in, text out; vLLM clients use it)."""

    endpoint: ClassVar[str] = COMPLETIONS
    streams: ClassVar[bool] = True
    text_field: ClassVar[str] = "prompt"

    model: str
    prompt: str | tuple[Any, ...]
    parameters: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    _count: int = field(default=1, repr=False, compare=False)

    @classmethod
    def from_openai(cls, body: Any) -> CompletionsCall:
        """Builds a call from an OpenAI completions request body; raises MalformedEnvelope."""
        return cls(*cls._parse(body, COMPLETION_PARAMETERS, allow_empty_text=True, required=True))

    def tokens(self, default_output_tokens: int) -> TokenCount:
        """Every prompt gets its own ``n`` choices, so the output estimate counts each prompt."""
        output = estimate_output_tokens(self.parameters, default_output_tokens)
        return TokenCount(estimate_input_tokens(self.prompt), min(MAX_TOKENS, output * self._count))


Call = ChatCall | EmbeddingsCall | CompletionsCall
ENDPOINTS: dict[str, type[ChatCall] | type[EmbeddingsCall] | type[CompletionsCall]] = {
    CHAT_COMPLETIONS: ChatCall,
    EMBEDDINGS: EmbeddingsCall,
    COMPLETIONS: CompletionsCall,
}


def decode_call(endpoint: Any, body: Any) -> Call:
    """The call an envelope carries, by its ``endpoint``; raises MalformedEnvelope."""
    if not isinstance(endpoint, str) or endpoint not in ENDPOINTS:
        raise _fail(f"envelope.endpoint must be one of {sorted(ENDPOINTS)}, got {endpoint!r}")
    return ENDPOINTS[endpoint].from_openai(body)
