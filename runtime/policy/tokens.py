"""Token counts of a chat call: a cheap estimate at launch, the backend's ``usage`` on completion.

Pure arithmetic, no I/O, no tokenizer. Fair shares in tokens (issue 22) charge a tenant at launch,
before any backend has counted anything, so the estimate must be cheap and never fail; the
completion's ``usage`` corrects it later. The heuristic, documented so that an operator can reason
about a charge:

* text: one token per :data:`CHARS_PER_TOKEN` characters, rounded up (OpenAI's rule of thumb for
  English; code and other scripts run denser, which the correction on completion absorbs);
* every message: :data:`MESSAGE_OVERHEAD` tokens for its role and separators, plus its ``name`` and
  any tool call's name and arguments, counted as text;
* an image part: :data:`IMAGE_TOKENS` (what OpenAI bills a 1024x1024 high-detail image); audio and
  file parts: :data:`ATTACHMENT_TOKENS` each;
* the reply's priming: :data:`REPLY_OVERHEAD` tokens;
* output: ``max_completion_tokens``, else ``max_tokens``, else the pool's default, times ``n``;
* an embeddings or legacy completions ``input``/``prompt``: each string as text, each token array by
  its length (no message overhead, no priming); an embedding has no output.

Every count is clamped into ``[0, MAX_TOKENS]`` so that a hostile body can neither be free nor
overflow a counter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, TypeGuard

__all__ = [
    "ATTACHMENT_TOKENS",
    "CHARS_PER_TOKEN",
    "IMAGE_TOKENS",
    "MAX_TOKENS",
    "MESSAGE_OVERHEAD",
    "REPLY_OVERHEAD",
    "TokenCount",
    "estimate_input_tokens",
    "estimate_output_tokens",
    "estimate_prompt_tokens",
    "estimate_tokens",
    "usage_tokens",
]

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD = 4
REPLY_OVERHEAD = 3
IMAGE_TOKENS = 765
ATTACHMENT_TOKENS = 256
MAX_TOKENS = 10_000_000  # far above any context window; bounds one request's charge
MAX_CHOICES = 128  # OpenAI's own cap on ``n``


class TokenCount(NamedTuple):
    """Prompt (input) and completion (output) tokens of one request."""

    prompt: int
    output: int


def _mapping(value: Any) -> TypeGuard[Mapping[Any, Any]]:
    # Decoded JSON is a dict: the ABC check (a fifth of an estimate's time) only for anything else.
    return type(value) is dict or isinstance(value, Mapping)


def _clamp(tokens: int) -> int:
    return max(0, min(MAX_TOKENS, tokens))


def _text_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)  # ceiling division


def _part_tokens(part: Any) -> int:
    if not _mapping(part):
        return 0
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        return _text_tokens(text) if isinstance(text, str) else 0
    if kind == "image_url":
        return IMAGE_TOKENS
    if kind == "refusal":
        refusal = part.get("refusal")
        return _text_tokens(refusal) if isinstance(refusal, str) else 0
    return ATTACHMENT_TOKENS


def _tool_call_tokens(calls: Any) -> int:
    if not isinstance(calls, list):
        return 0
    tokens = 0
    for call in calls:
        function = call.get("function") if _mapping(call) else None
        if _mapping(function):
            for field in ("name", "arguments"):
                value = function.get(field)
                tokens += _text_tokens(value) if isinstance(value, str) else 0
    return tokens


def _message_tokens(message: Any) -> int:
    if not _mapping(message):
        return MESSAGE_OVERHEAD
    tokens = MESSAGE_OVERHEAD
    content = message.get("content")
    if isinstance(content, str):
        tokens += _text_tokens(content)
    elif isinstance(content, list):
        tokens += sum(_part_tokens(part) for part in content)
    name = message.get("name")
    if isinstance(name, str):
        tokens += _text_tokens(name)
    return tokens + _tool_call_tokens(message.get("tool_calls"))


def estimate_prompt_tokens(messages: Sequence[Any]) -> int:
    """Estimated prompt tokens of a call's messages (see the module's heuristic)."""
    return _clamp(REPLY_OVERHEAD + sum(_message_tokens(m) for m in messages))


def estimate_input_tokens(inputs: Any) -> int:
    """Estimated tokens of an embeddings ``input`` or a legacy completions ``prompt``: a string, or a
    list of strings, of token ids, or of token-id lists (anything else counts nothing)."""
    if isinstance(inputs, str):
        return _clamp(_text_tokens(inputs))
    if not isinstance(inputs, list | tuple):
        return 0
    tokens = 0
    for item in inputs:
        if isinstance(item, str):
            tokens += _text_tokens(item)
        elif isinstance(item, list | tuple):
            tokens += len(item)
        elif type(item) is int:
            tokens += 1
    return _clamp(tokens)


def _positive_int(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None


def estimate_output_tokens(parameters: Mapping[str, Any], default_output_tokens: int) -> int:
    """The output a call may produce: its own cap if it sets one, else the pool's default, per choice."""
    cap = _positive_int(parameters.get("max_completion_tokens")) or _positive_int(
        parameters.get("max_tokens")
    )
    per_choice = cap if cap is not None else max(0, default_output_tokens)
    choices = min(MAX_CHOICES, _positive_int(parameters.get("n")) or 1)
    return _clamp(per_choice * choices)


def estimate_tokens(
    messages: Sequence[Any], parameters: Mapping[str, Any], default_output_tokens: int
) -> TokenCount:
    """The launch-time estimate of a call: prompt from its messages, output from its caps."""
    return TokenCount(
        estimate_prompt_tokens(messages), estimate_output_tokens(parameters, default_output_tokens)
    )


def usage_tokens(completion: Any) -> TokenCount | None:
    """The backend's reported ``usage`` of a completion; None when it reports none or nonsense,
    so the launch estimate stands (a backend that omits ``usage`` is charged what was estimated)."""
    usage = completion.get("usage") if _mapping(completion) else None
    if not _mapping(usage):
        return None
    prompt, output = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if output is None and completion.get("object") == "list":  # an embeddings answer: no output
        output = 0
    if type(prompt) is not int or type(output) is not int or prompt < 0 or output < 0:
        return None
    return TokenCount(_clamp(prompt), _clamp(output))
