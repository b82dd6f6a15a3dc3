"""Relaying one streamed backend call to its producer, chunk by chunk, as the chunks arrive.

Each chunk goes to the producer's reply list (``list:llm:replies:{producer_id}``, with the list's TTL)
in one atomic step that first checks the producer's liveness key: a producer gone mid-stream stops the
relay, and the backend call is cut off (:class:`ProducerGoneMidStream`, counted by its error type).
The relay assembles the streamed text into an ordinary completion for the final reply and history: a
``chat.completion``, or a ``text_completion`` for a streamed legacy completions call.

In ``durable`` mode chunks are fenced like replies: the same step checks that the lease is still this
attempt's (its fencing token), so a dispatcher whose lease was taken away sends nothing more
(:class:`StaleStream`). The first chunk that reaches the producer also takes the request's requeue
envelope away and marks its lease record ``streamed``: from then on an expired lease does not run the
request again (the producer would get the first chunks twice, or two attempts interleaved); whoever
reaps it answers ``stream_interrupted`` instead.
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
from runtime.immutable import immutable
from runtime.queue import registry
from runtime.queue.keys import KeySpace
from runtime.queue.scripts import RELAY_STALE
from runtime.wire.contract import CHAT_COMPLETIONS, Envelope, StreamChunk


@immutable
class Fence:
    """The claim a streamed attempt relays under: its lease member and fencing token ("" unfenced), and
    the lease record marked streamed that its first chunk stores (b"" in lists mode)."""

    member: str = ""
    token: str = ""
    streamed_record: bytes = b""


class ProducerGoneMidStream(Cancelled):
    """The producer's liveness key vanished while its call streamed: the backend call was cut off."""

    error_type = "stream_producer_gone"


class StaleStream(Cancelled):
    """The attempt's lease was taken away mid-stream (its dispatcher froze past it): nothing more is
    relayed, and its finish is refused as a stale attempt."""

    error_type = "stale_attempt"


@dataclass(slots=True)
class StreamSummary:
    """What the relay saw: for the final reply and the history row."""

    chunks: int = 0
    relayed: int = 0  # chunks that reached the producer's reply list
    first_chunk_at: float | None = None
    model: str | None = None
    finish_reason: str | None = None
    usage: Mapping[str, Any] | None = None
    text: list[str] = field(default_factory=list)
    endpoint: str = CHAT_COMPLETIONS  # COMPLETIONS: the chunks' choices carry ``text``, not a delta

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
            if self.endpoint == CHAT_COMPLETIONS:
                delta = choice.get("delta")
                text = delta.get("content") if isinstance(delta, Mapping) else None
            else:
                text = choice.get("text")
            if isinstance(text, str):
                self.text.append(text)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def completion(self, request_id: str) -> Completion:
        text = "".join(self.text)
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}}
            if self.endpoint == CHAT_COMPLETIONS
            else {"index": 0, "text": text, "logprobs": None}
        )
        choice["finish_reason"] = self.finish_reason
        chat = self.endpoint == CHAT_COMPLETIONS
        body: dict[str, Any] = {
            "id": f"chatcmpl-{request_id}" if chat else f"cmpl-{request_id}",
            "object": "chat.completion" if chat else "text_completion",
            "model": self.model,
            "choices": [choice],
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
    """Streams calls for one dispatcher, relaying each chunk with ``lua/relay.lua``."""

    def __init__(self, client: aioredis.Redis, keys: KeySpace, *, reply_ttl_s: float, group_id: str) -> None:
        self.keys = keys
        self.reply_ttl_ms = int(reply_ttl_s * 1000)
        self._relay = registry.script("relay").bind(client)
        self._claims = [
            keys.lease_tokens(group_id),
            keys.lease_records(group_id),
            keys.durable_leases(group_id),
        ]

    def __repr__(self) -> str:
        return f"<StreamRelay reply_ttl_ms={self.reply_ttl_ms}>"

    async def run(
        self,
        backend: OpenAIBackend,
        envelope: Envelope,
        *,
        started_at: float,
        summary: StreamSummary,
        fence: Fence = Fence(),
    ) -> Completion:
        """Streams the call, relaying each chunk; returns the assembled completion."""
        assert envelope.stream is not None
        include_usage = envelope.stream.include_usage
        body = envelope.call.to_openai()
        body["stream_options"] = {"include_usage": True}
        queue_wait: float | None = max(0.0, started_at - envelope.enqueued_at)
        chunks: AsyncIterator[dict[str, Any]] = backend.stream(body, endpoint=envelope.call.endpoint)
        async with contextlib.aclosing(chunks):  # type: ignore[type-var]
            await self._relay_all(chunks, envelope, include_usage, queue_wait, summary, fence)
        return summary.completion(envelope.request_id)

    async def answer(self, producer_id: str, reply: bytes) -> bool:
        """Queues ``reply`` for the producer if it is alive (unfenced: for a request whose lease is gone)."""
        keys = [self.keys.producer_alive(producer_id), self.keys.replies(producer_id), *self._claims]
        return int(await self._relay(keys=keys, args=[reply, self.reply_ttl_ms, "", "", ""])) == 1

    async def _relay_all(
        self,
        chunks: AsyncIterator[dict[str, Any]],
        envelope: Envelope,
        include_usage: bool,
        queue_wait: float | None,
        summary: StreamSummary,
        fence: Fence,
    ) -> None:
        keys = [self.keys.producer_alive(envelope.producer_id), self.keys.replies(envelope.producer_id)]
        keys += self._claims
        async for chunk in chunks:
            summary.add(chunk, time.time())
            outgoing = for_client(chunk, include_usage)
            if outgoing is None:
                continue
            raw = StreamChunk(envelope.request_id, outgoing, queue_wait).encode()
            queue_wait = None
            record = fence.streamed_record if summary.relayed == 0 else b""
            sent = int(
                await self._relay(keys=keys, args=[raw, self.reply_ttl_ms, fence.member, fence.token, record])
            )
            if sent == RELAY_STALE:
                raise StaleStream(
                    f"request {envelope.request_id}: the lease of this attempt expired mid-stream"
                )
            if not sent:
                raise ProducerGoneMidStream(
                    f"producer {envelope.producer_id} went away while request {envelope.request_id} streamed"
                )
            summary.relayed += 1


def stream_timeout(budget_s: float, display_url: str) -> BackendTimeout:
    return BackendTimeout(f"backend {display_url} did not finish streaming within {budget_s:.3g}s")
