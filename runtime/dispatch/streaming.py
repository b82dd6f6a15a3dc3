"""Relaying one streamed backend call to its producer, chunk by chunk, as the chunks arrive.

Each chunk goes to the producer's reply list (``list:llm:replies:{producer_id}``, with the list's TTL)
in one atomic step that first checks the producer's liveness key: a producer gone mid-stream stops the
relay, and the backend call is cut off (:class:`ProducerGoneMidStream`, counted by its error type).
The relay assembles the streamed text into an ordinary chat completion for the final reply and history.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from runtime.backends.adapter import Completion, OpenAIBackend, parse_usage
from runtime.errors import BackendTimeout, Cancelled
from runtime.valkey.lua import LuaScript
from runtime.wire.contract import Envelope, StreamChunk
from runtime.wire.keys import KeySpace

# KEYS: producer alive key, replies list; ARGV: chunk bytes, reply list TTL ms
# Returns 1 when the chunk was queued for the producer, 0 when the producer is gone.
RELAY = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"""


class ProducerGoneMidStream(Cancelled):
    """The producer's liveness key vanished while its call streamed: the backend call was cut off."""

    error_type = "stream_producer_gone"


@dataclass(slots=True)
class StreamSummary:
    """What the relay saw: for the final reply and the history row."""

    chunks: int = 0
    first_chunk_at: float | None = None
    model: str | None = None
    finish_reason: str | None = None
    usage: Mapping[str, Any] | None = None
    text: list[str] = field(default_factory=list)

    def add(self, chunk: Mapping[str, Any], now: float) -> None:
        self.chunks += 1
        if self.first_chunk_at is None:
            self.first_chunk_at = now
        if isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        if isinstance(chunk.get("usage"), Mapping):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping):
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping) and isinstance(delta.get("content"), str):
                self.text.append(delta["content"])
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def completion(self, request_id: str) -> Completion:
        body: dict[str, Any] = {
            "id": f"chatcmpl-{request_id}",
            "object": "chat.completion",
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(self.text)},
                    "finish_reason": self.finish_reason,
                }
            ],
        }
        if self.usage is not None:
            body["usage"] = dict(self.usage)
        return Completion(body=body, usage=parse_usage(body), status_code=200, model=self.model)


def for_client(chunk: Mapping[str, Any], include_usage: bool) -> Mapping[str, Any] | None:
    """The chunk as the client asked for it: usage only with ``include_usage`` (we always ask for it,
    for history); None when nothing is left to send."""
    if include_usage or "usage" not in chunk:
        return chunk
    if not chunk.get("choices"):
        return None
    return {k: v for k, v in chunk.items() if k != "usage"}


class StreamRelay:
    """Streams calls for one dispatcher; the Lua relay script is registered once."""

    def __init__(self, client: aioredis.Redis, keys: KeySpace, *, reply_ttl_s: float) -> None:
        self.keys = keys
        self.reply_ttl_ms = int(reply_ttl_s * 1000)
        self._relay = LuaScript(RELAY).bind(client)

    def __repr__(self) -> str:
        return f"<StreamRelay reply_ttl_ms={self.reply_ttl_ms}>"

    async def run(
        self, backend: OpenAIBackend, envelope: Envelope, *, started_at: float, summary: StreamSummary
    ) -> Completion:
        """Streams the call, relaying each chunk; returns the assembled completion."""
        assert envelope.stream is not None
        include_usage = envelope.stream.include_usage
        body = envelope.call.to_openai()
        body["stream_options"] = {"include_usage": True}
        queue_wait: float | None = max(0.0, started_at - envelope.enqueued_at)
        chunks: AsyncIterator[dict[str, Any]] = backend.stream(body)
        async with contextlib.aclosing(chunks):  # type: ignore[type-var]
            await self._relay_all(chunks, envelope, include_usage, queue_wait, summary)
        return summary.completion(envelope.request_id)

    async def _relay_all(
        self,
        chunks: AsyncIterator[dict[str, Any]],
        envelope: Envelope,
        include_usage: bool,
        queue_wait: float | None,
        summary: StreamSummary,
    ) -> None:
        alive = self.keys.producer_alive(envelope.producer_id)
        replies = self.keys.replies(envelope.producer_id)
        async for chunk in chunks:
            summary.add(chunk, time.time())
            outgoing = for_client(chunk, include_usage)
            if outgoing is None:
                continue
            raw = StreamChunk(envelope.request_id, outgoing, queue_wait).encode()
            queue_wait = None
            if not await self._relay(keys=[alive, replies], args=[raw, self.reply_ttl_ms]):
                raise ProducerGoneMidStream(
                    f"producer {envelope.producer_id} went away while request {envelope.request_id} streamed"
                )


def stream_timeout(budget_s: float, display_url: str) -> BackendTimeout:
    return BackendTimeout(f"backend {display_url} did not finish streaming within {budget_s:.3g}s")
