"""The producer's reply pump: one blocking connection drains the reply list for every waiter.

The pump's take (``lua/take_replies.lua``): replies move from the reply list to its taken list and
leave that only once delivered, acknowledged with the next take. A pop is never answered into a dead
connection: a Valkey frozen mid-wait (a silent partition) serves the pump's abandoned BLMPOP when it
resumes and sends the replies into a socket nobody reads; moved, they are still there for the next
take. The ack is fenced by a sequence number, so a take replayed on resume trims nothing twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from runtime.backoff import Backoff
from runtime.errors import MalformedEnvelope
from runtime.producer.outcomes import ProducerStats
from runtime.queue.keys import REPLY_LIST_TTL_S, KeySpace
from runtime.queue.scripts import TAKE_REPLIES
from runtime.valkey.client import REDIS_ERRORS, dedicated_connection, failing_over
from runtime.wire.contract import Reply, StreamChunk, decode_reply_item

__all__ = ["ANSWERED_MEMORY", "PUMP_BACKOFF_S", "REPLY_BATCH", "REPLY_BLOCK_S", "ReplyPump", "Waiter"]

log = logging.getLogger(__name__)
REPLY_BATCH = 512  # most replies the pump takes per round trip
REPLY_BLOCK_S = 1  # how long one BLMOVE of the pump waits for a first reply
WAKE_SENTINEL = b"\x00wake"
# How many answered request ids a producer remembers to recognise a duplicate reply: far more than the
# replies that can arrive within a lease (when a requeued request's second execution could answer).
ANSWERED_MEMORY = 100_000
PUMP_BACKOFF_S = (0.1, 5.0)  # the reply pump's pause after losing Valkey: first and longest


@dataclass(slots=True)
class Waiter:
    future: asyncio.Future[Reply]
    pool_id: str


class ReplyPump:
    """Hands each reply to the waiter (a submit) or the inbox (a stream) with its ``request_id``."""

    def __init__(
        self, client: aioredis.Redis, keys: KeySpace, producer_id: str, stats: ProducerStats
    ) -> None:
        self.client = client
        self.keys = keys
        self.producer_id = producer_id
        self.stats = stats
        self.waiters: dict[str, Waiter] = {}
        self.streams: dict[str, asyncio.Queue[Reply | StreamChunk]] = {}
        # Recently answered request ids: a producer keeps the first reply per request_id (at least once
        # may deliver another) and counts and discards any later one.
        self.answered: OrderedDict[str, None] = OrderedDict()
        self.closed = False

    def __repr__(self) -> str:
        return f"<ReplyPump waiting={len(self.waiters)} streams={len(self.streams)}>"

    async def run(self) -> None:
        # A connection of its own: the pump blocks on it, and a shared one would wait behind it.
        own = dedicated_connection(self.client)
        try:
            await self._pump(own)
        finally:
            with contextlib.suppress(*REDIS_ERRORS):
                await own.aclose()

    async def _pump(self, own: Any) -> None:
        backoff = Backoff(*PUMP_BACKOFF_S)
        reply_key = self.keys.replies(self.producer_id)
        taken_key = self.keys.replies_taken(self.producer_id)
        keys = [reply_key, taken_key, self.keys.replies_acked(self.producer_id)]
        ttl_ms = int(REPLY_LIST_TTL_S * 1000)
        # Above any sequence an earlier pump of the same producer_id acknowledged (a restarted process).
        seq, delivered = time.time_ns() // 1000, 0
        while not self.closed:
            try:
                # Up to a batch of replies per round trip: BLMOVE blocks for the first, the take moves the
                # rest (it runs right after, on this connection) and acknowledges the last batch.
                _, batch = await own.execute(
                    [
                        ("BLMOVE", reply_key, taken_key, "LEFT", "RIGHT", REPLY_BLOCK_S),
                        ("EVAL", TAKE_REPLIES, len(keys), *keys, seq, delivered, REPLY_BATCH, ttl_ms),
                    ],
                    block_s=REPLY_BLOCK_S,
                )
                if isinstance(batch, Exception):
                    raise batch  # an error reply (e.g. OOM): nothing taken, retried like a lost connection
                seq, delivered = seq + 1, len(batch)
                if not batch:
                    continue
                backoff.reset()
            except (*REDIS_ERRORS, RedisError) as exc:
                self.stats.pump_reconnects += 1
                pause = backoff.next(failing_over=failing_over(exc))
                log.warning(
                    "producer %s reply pump lost Valkey (%s); retrying in %.1fs", self.producer_id, exc, pause
                )
                await asyncio.sleep(pause)
                continue
            for raw in batch:
                self.deliver(raw)

    def deliver(self, raw: bytes | str) -> None:
        if raw == WAKE_SENTINEL:
            return
        try:
            reply = decode_reply_item(raw)
        except MalformedEnvelope as exc:
            self.stats.malformed_replies += 1
            log.warning("producer %s dropped a malformed reply: %s", self.producer_id, exc)
            return
        if reply.request_id in self.answered:
            self.stats.duplicate_replies += 1
            return
        inbox = self.streams.get(reply.request_id)
        if inbox is not None:
            inbox.put_nowait(reply)
            if isinstance(reply, Reply):
                self._remember_answered(reply.request_id)
            return
        if isinstance(reply, StreamChunk):
            self.stats.late_replies += 1
            return
        waiter = self.waiters.pop(reply.request_id, None)
        if waiter is None or waiter.future.done():
            self.stats.late_replies += 1
            return
        waiter.future.set_result(reply)
        self._remember_answered(reply.request_id)

    def _remember_answered(self, request_id: str) -> None:
        self.answered[request_id] = None
        if len(self.answered) > ANSWERED_MEMORY:
            self.answered.popitem(last=False)
