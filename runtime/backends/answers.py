"""What a backend answered, read: the completion and its token usage, the provider's own error message,
and how long a ``Retry-After`` asks to wait. Pure parsing; :mod:`runtime.backends.adapter` uses it."""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping
from typing import Any, Protocol

import orjson

from runtime.immutable import immutable

SNIPPET = 200


@immutable
class Usage:
    """Token usage as the backend reported it; None where it did not."""

    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None


@immutable
class Completion:
    """A successful chat completion."""

    body: dict[str, Any]
    usage: Usage | None
    status_code: int
    model: str | None


class Answer(Protocol):
    """A backend's whole HTTP answer: an ``httpx.Response`` (injected transports) or the default
    client's :class:`~runtime.backends.body.BodyResponse`."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content(self) -> bytes: ...


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_usage(body: Mapping[str, Any]) -> Usage | None:
    """``usage.prompt_tokens/completion_tokens/total_tokens`` (or ``input_/output_tokens``), if any."""
    usage = body.get("usage")
    if type(usage) is dict:  # OpenAI's own shape, every count an int: read once, no fallbacks
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        total = usage.get("total_tokens")
        if type(prompt) is int and type(completion) is int and type(total) is int:
            return Usage(input_tokens=prompt, output_tokens=completion, total_tokens=total)
    if not isinstance(usage, Mapping):
        return None
    prompt = _int_or_none(usage.get("prompt_tokens", usage.get("input_tokens")))
    completion = _int_or_none(usage.get("completion_tokens", usage.get("output_tokens")))
    total = _int_or_none(usage.get("total_tokens"))
    if total is None and prompt is not None and completion is not None:
        total = prompt + completion
    if prompt is None and completion is None and total is None:
        return None
    return Usage(input_tokens=prompt, output_tokens=completion, total_tokens=total)


def provider_message(content: bytes) -> str:
    """The most useful text of an error body: OpenAI's ``error.message``, vLLM's ``message``, or a snippet."""
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        for candidate in (error, body.get("message"), body.get("detail")):
            if isinstance(candidate, str) and candidate:
                return candidate
    text = content[:SNIPPET].decode("utf-8", "replace").strip()
    return f"{text!r}" if text else "(empty body)"


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (delta-seconds or an HTTP date); None if unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) else None
