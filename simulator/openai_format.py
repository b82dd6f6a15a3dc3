"""OpenAI's chat-completions shapes as the simulator writes them: checks, bodies, chunks, errors (and
the legacy ``text_completion`` bodies and chunks; embeddings are in :mod:`simulator.endpoints_format`).

Pure functions of their arguments; the server decides when to call them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

# Keys of the per-request ``"sim"`` test hook.
SIM_KEYS = frozenset(
    {
        "latency_ms",
        "status",
        "message",
        "invalid_body",
        "completion_tokens",
        "ttft_ms",
        "itl_ms",
        "hang",
        "fail_times",
        "key",
        "retry_after",
    }
)
_SIM_MILLISECONDS = ("latency_ms", "ttft_ms", "itl_ms")
_REPLY_PADDING = " and so on"
CHARS_PER_TOKEN = 4

# OpenAI's error vocabulary (``type``, ``code``) for the statuses it documents; others are server errors.
_ERROR_KINDS = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", "permission_denied"),
    404: ("invalid_request_error", "not_found"),
    408: ("timeout_error", "timeout"),
    409: ("conflict_error", "conflict"),
    411: ("invalid_request_error", "length_required"),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", "unprocessable"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}


def error_body(status: int, message: str) -> bytes:
    """OpenAI's error body shape for a status."""
    kind, code = _ERROR_KINDS.get(status, ("server_error", "internal_error"))
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


def check_request(request: Any) -> str:
    """Why a chat-completions request is refused with 400, or '' when it is acceptable."""
    if not isinstance(request, dict):
        return "request body must be a JSON object"
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    return check_stream_fields(request) or check_sim_field(request)


def check_stream_fields(request: dict[str, Any]) -> str:
    """Why a request's ``stream`` / ``stream_options`` are refused, or ''."""
    stream = request.get("stream", False)
    if not isinstance(stream, bool):
        return "'stream' must be true or false"
    options = request.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return "'stream_options' must be an object"
    if options is not None and not stream:
        return "'stream_options' is only allowed when 'stream' is true"  # as vLLM and OpenAI refuse it
    return ""


def check_sim_field(request: dict[str, Any]) -> str:
    """Why a request's ``sim`` object (the per-request behaviour hook) is refused, or ''."""
    sim = request.get("sim")
    if sim is None:
        return ""
    if not isinstance(sim, dict):
        return "'sim' must be an object"
    return _check_sim(sim)


def _check_sim(sim: dict[str, Any]) -> str:
    unknown = set(sim) - SIM_KEYS
    if unknown:
        return f"unknown 'sim' keys: {sorted(unknown)}; allowed: {sorted(SIM_KEYS)}"
    for key in _SIM_MILLISECONDS:
        value = sim.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 3.6e6:
            return f"'sim.{key}' must be a number of milliseconds >= 0"
    status = sim.get("status", 200)
    if isinstance(status, bool) or not isinstance(status, int) or not 200 <= status <= 599:
        return "'sim.status' must be an HTTP status between 200 and 599"
    retry_after = sim.get("retry_after", 0)
    if isinstance(retry_after, bool) or not isinstance(retry_after, int) or retry_after < 0:
        return "'sim.retry_after' must be a whole number of seconds >= 0"
    tokens = sim.get("completion_tokens", 0)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        return "'sim.completion_tokens' must be an integer >= 0"
    return ""


def _text_of(content: Any) -> tuple[str, int]:
    """The text of a message's content and its number of image parts."""
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        return "", 0
    texts, images = [], 0
    for part in content:
        if isinstance(part, dict):
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif part.get("type") == "image_url":
                images += 1
    return " ".join(texts), images


def estimate_prompt(messages: list[Any]) -> tuple[int, str]:
    """Rough prompt tokens (chars/4 + 4 per message + 85 per image) and the last message's text."""
    tokens, last = 0, ""
    for message in messages:
        text, images = _text_of(message.get("content")) if isinstance(message, dict) else ("", 0)
        tokens += 4 + len(text) // CHARS_PER_TOKEN + 85 * images
        last = text
    return tokens, last


def reply_tokens(text: str, count: int) -> list[str]:
    """The reply to ``text`` as ``count`` tokens of 4 characters: it echoes the prompt, then pads."""
    reply = f"Simulated reply to: {text}"
    wanted = CHARS_PER_TOKEN * count
    if len(reply) < wanted:
        reply += _REPLY_PADDING * (1 + (wanted - len(reply)) // len(_REPLY_PADDING))
    return [reply[i : i + CHARS_PER_TOKEN] for i in range(0, wanted, CHARS_PER_TOKEN)]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    *, completion_id: str, created: int, model: str, content: str, finish: str, usage: dict[str, int]
) -> bytes:
    """A non-streaming ``chat.completion``."""
    return orjson.dumps(
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": finish,
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }
    )


def chunk_event(
    *,
    completion_id: str,
    created: int,
    model: str,
    delta: dict[str, str] | None = None,
    finish: str | None = None,
    usage: dict[str, int] | None = None,
) -> bytes:
    """One server-sent event carrying a ``chat.completion.chunk``.

    With ``usage`` the chunk has no choices: it is the last chunk ``stream_options.include_usage`` asks for.
    """
    chunk: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": []
        if usage is not None
        else [{"index": 0, "delta": delta or {}, "finish_reason": finish, "logprobs": None}],
    }
    if usage is not None:
        chunk["usage"] = usage
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def text_completion_body(
    *, completion_id: str, created: int, model: str, text: str, finish: str, usage: dict[str, int]
) -> bytes:
    """A non-streaming ``text_completion``."""
    return orjson.dumps(
        {
            "id": completion_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
            "usage": usage,
        }
    )


def text_chunk_event(
    *,
    completion_id: str,
    created: int,
    model: str,
    text: str = "",
    finish: str | None = None,
    usage: dict[str, int] | None = None,
) -> bytes:
    """One server-sent event of a streamed ``text_completion`` (with ``usage``: the choice-less last one)."""
    chunk: dict[str, Any] = {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": []
        if usage is not None
        else [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
    }
    if usage is not None:
        chunk["usage"] = usage
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Reply:
    """One successful completion being answered: what its body, or each of its chunks, repeats."""

    model: str
    completion_id: str
    prompt_tokens: int
    tokens: list[str]
    finish: str
    created: int = field(default_factory=lambda: int(time.time()))
    legacy: bool = False  # a legacy ``text_completion`` (POST /v1/completions), not a chat completion

    def usage(self) -> dict[str, int]:
        return usage(self.prompt_tokens, len(self.tokens))

    def body(self) -> bytes:
        if self.legacy:
            return text_completion_body(
                completion_id=self.completion_id, created=self.created, model=self.model,
                text="".join(self.tokens), finish=self.finish, usage=self.usage(),
            )  # fmt: skip
        return completion_body(
            completion_id=self.completion_id,
            created=self.created,
            model=self.model,
            content="".join(self.tokens),
            finish=self.finish,
            usage=self.usage(),
        )

    def chunk(self, delta: dict[str, str], finish: str | None = None) -> bytes:
        if self.legacy:
            return text_chunk_event(
                completion_id=self.completion_id, created=self.created, model=self.model,
                text=delta.get("content", ""), finish=finish,
            )  # fmt: skip
        return chunk_event(
            completion_id=self.completion_id,
            created=self.created,
            model=self.model,
            delta=delta,
            finish=finish,
        )

    def usage_chunk(self) -> bytes:
        if self.legacy:
            return text_chunk_event(
                completion_id=self.completion_id, created=self.created, model=self.model, usage=self.usage()
            )
        return chunk_event(
            completion_id=self.completion_id, created=self.created, model=self.model, usage=self.usage()
        )
