"""The producer client: submit a chat completion to a pool and get the completion back.

One :class:`Producer` owns one ``producer_id``. While it can receive replies it keeps
``key:llm:producer:{producer_id}:alive`` fresh; a single reply pump drains
``list:llm:replies:{producer_id}`` and hands each reply to the waiter with that ``request_id``, so
thousands of concurrent submits share one connection. A submit that times out or is cancelled
removes its waiter; a reply arriving for it later is counted as late and discarded.

When the pool's fabric group has queueing disabled in the admin (or ``direct_backend`` is set),
``submit`` calls the backend itself, skipping the queue and the dispatchers, and returns the same
:class:`CompletionResult` shape (zero queue wait), raising the same typed errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis.asyncio as aioredis
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from redis.exceptions import RedisError

from runtime import eventloop
from runtime.backends.adapter import BackendPool, OpenAIBackend
from runtime.backoff import Backoff
from runtime.config import ProducerSettings
from runtime.dispatch.admission import (
    ADMIT_PUSH,
    KeyLease,
    KeyLeases,
    admission_args,
    admit_and_push,
    queue_full,
)
from runtime.dispatch.queue import lease_member
from runtime.dispatch.wakeup import PUSH, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS
from runtime.errors import (
    Cancelled,
    DispatchError,
    MalformedEnvelope,
    ProducerClosed,
    QueueFull,
    QueueUnavailable,
    RequestTimeout,
    UnknownPool,
    error_from_type,
)
from runtime.policy.admission import REASON_KEY_IN_FLIGHT, AdmissionLimits, KeyLimits
from runtime.telemetry import semconv
from runtime.valkey.client import REDIS_ERRORS, connect, dedicated_connection
from runtime.valkey.lua import LuaScript
from runtime.valkey.persisted import PERSISTED, PersistedPusher
from runtime.wire.contract import (
    ChatCall,
    Envelope,
    Metadata,
    Reply,
    StreamChunk,
    StreamOptions,
    Timing,
    decode_reply_item,
    envelope_prefix,
)
from runtime.wire.groupconfig import GroupConfig
from runtime.wire.keys import DEFAULT_KEYS, REPLY_LIST_TTL_S, KeySpace

log = logging.getLogger(__name__)
_PUSH = LuaScript(PUSH)
# The pool registry and the configuration of every group it names, in one round trip (a script, so a
# cancelled reader is cancelled at once: redis-py's own commands can swallow the cancellation).
_READ_REGISTRY = LuaScript(
    """
local flat = redis.call('HGETALL', KEYS[1])
local seen, groups, configs = {}, {}, {}
for i = 2, #flat, 2 do
  if not seen[flat[i]] then seen[flat[i]] = true; groups[#groups + 1] = flat[i] end
end
table.sort(groups)
for i, group in ipairs(groups) do configs[i] = redis.call('GET', ARGV[1] .. group) end
return {flat, groups, configs}
"""
)
# KEYS: the pool's list, its delayed set and, when its group is known, the group's counters; ARGV: the
# envelope, the counter's field, the start of the request's envelopes (its id is the first field).
# Removes the queued request, or its retry waiting in the delayed set (stored as its next attempt's
# envelope, so found by id), and counts it; returns how many were removed.
_WITHDRAW = LuaScript(
    """
local removed = redis.call('LREM', KEYS[1], 1, ARGV[1])
if removed == 0 then
  for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    if string.sub(member, 1, #ARGV[3]) == ARGV[3] then
      removed = redis.call('ZREM', KEYS[2], member)
      break
    end
  end
end
if removed > 0 and KEYS[3] then redis.call('HINCRBY', KEYS[3], ARGV[2], 1) end
return removed
"""
)
REPLY_BATCH = 512  # most replies the pump takes per round trip
REPLY_BLOCK_S = 1  # how long one BLMOVE of the pump waits for a first reply
# The pump's take: replies move from the reply list to its taken list and leave that only once
# delivered, acknowledged with the next take. A pop is never answered into a dead connection: a Valkey
# frozen mid-wait (a silent partition) serves the pump's abandoned BLMPOP when it resumes and sends the
# replies into a socket nobody reads; moved, they are still there for the next take. The ack is fenced
# by a sequence number, so a take replayed on resume trims nothing twice.
# KEYS: reply list, taken list, ack key; ARGV: ack sequence, replies delivered since, batch, ttl ms.
# Returns the taken list (undelivered replies first, in order). Sent as EVAL, source and all: the
# pump's connection is its own, and a server restarted under it has no script cache to miss.
_TAKE_REPLIES = """
if tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[3]) or '0') then
  redis.call('LTRIM', KEYS[2], ARGV[2], -1)
  redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[4])
end
local room = tonumber(ARGV[3]) - redis.call('LLEN', KEYS[2])
if room > 0 then
  local more = redis.call('LPOP', KEYS[1], room)
  if more then redis.call('RPUSH', KEYS[2], unpack(more)) end
end
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return redis.call('LRANGE', KEYS[2], 0, -1)
"""
_ADMIT_PUSH = LuaScript(ADMIT_PUSH)
_propagator = TraceContextTextMapPropagator()
_T = TypeVar("_T")
_WAKE_SENTINEL = b"\x00wake"
# How many answered request ids a producer remembers to recognise a duplicate reply: far more than the
# replies that can arrive within a lease (when a requeued request's second execution could answer).
ANSWERED_MEMORY = 100_000
PUMP_BACKOFF_S = (0.1, 5.0)  # the reply pump's pause after losing Valkey: first and longest
_UNBOUNDED = AdmissionLimits()


@dataclass(frozen=True, slots=True)
class CompletionResult:
    """What ``submit`` returns, the same on the queued and the direct path."""

    request_id: str
    pool_id: str
    completion: Mapping[str, Any]
    timing: Timing


@dataclass(slots=True)
class ProducerStats:
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    rejected: int = 0  # refused at submit by the pool's admission limits (QueueFull)
    timed_out: int = 0
    cancelled: int = 0  # withdrawn by the caller (e.g. an ingress client that disconnected)
    withdrawn_queued: int = 0  # of those, taken back out of their list before any dispatcher saw them
    late_replies: int = 0
    duplicate_replies: int = 0  # a second reply for a request already answered (discarded)
    malformed_replies: int = 0
    pump_reconnects: int = 0
    # Durable pushes answered without the persistence asked for (the reason is in ``persistence``).
    unpersisted_pushes: int = 0
    # Registry reads that found the published configuration missing (Valkey lost it): the producer
    # then keeps checking with its last known configuration (``Producer.configuration``).
    config_missing_reads: int = 0


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[Reply]
    pool_id: str


@dataclass(slots=True)
class _PoolRegistry:
    """Which group each enabled pool belongs to, and each group's published configuration."""

    pools: dict[str, str] = field(default_factory=dict)
    groups: dict[str, GroupConfig] = field(default_factory=dict)
    read_at: float = float("-inf")
    # Each pool's admission limits, worked out once per read instead of once per submit.
    limits: dict[str, AdmissionLimits] = field(default_factory=dict)
    # Where it came from: "published" (as read), "last_known" (Valkey lost some or all of it and this
    # is what the producer read before), "none" (nothing was ever read: the checks are skipped).
    source: str = "none"


class Producer:
    """Async producer client. Use ``async with Producer(...)`` or call ``start``/``close``."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        settings: ProducerSettings | None = None,
        keys: KeySpace = DEFAULT_KEYS,
        producer_id: str | None = None,
        direct_backend: OpenAIBackend | None = None,
        tracer: trace.Tracer | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> None:
        """``direct_backend`` forces direct mode; otherwise a pool whose fabric group has queueing
        disabled is called directly at its endpoint, with the API key named by the group found in
        ``secrets`` (e.g. ``os.environ``)."""
        self.client = client
        self.settings = settings or ProducerSettings()
        self.keys = keys
        self.producer_id = producer_id or f"producer-{uuid.uuid4().hex[:16]}"
        self.direct_backend = direct_backend
        self.secrets = dict(secrets or {})
        self._backends: BackendPool | None = None
        self.stats = ProducerStats()
        self._tracer = tracer or trace.get_tracer("llm_dispatch.producer")
        self._waiters: dict[str, _Waiter] = {}
        # Recently answered request ids: a producer keeps the first reply per request_id (at least once
        # may deliver another) and counts and discards any later one.
        self._answered: OrderedDict[str, None] = OrderedDict()
        self._streams: dict[str, asyncio.Queue[Reply | StreamChunk]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._registry = _PoolRegistry()
        self._registry_read: asyncio.Future[_PoolRegistry] | None = None
        self._started = False
        self._closed = False
        self._closing = asyncio.Event()
        self._alive_key = keys.producer_alive(self.producer_id)
        self._reply_key = keys.replies(self.producer_id)
        # The request and a wake token for one idle dispatcher, in one script run by SHA over the
        # client's pipelined connection (a direct-mode producer may have no Valkey client at all).
        self._push_script = _PUSH.bind(client)
        self._admit_script = _ADMIT_PUSH.bind(client)
        self._registry_script = _READ_REGISTRY.bind(client)
        self._withdraw_script = _WITHDRAW.bind(client)
        self._key_leases = KeyLeases(client, keys, self.settings.alive_ttl_s)
        # Direct calls never reach Valkey: a key's most-in-flight is counted per process there.
        self._direct_open: Counter[str] = Counter()
        self.persistence = PersistedPusher(client, timeout_s=self.settings.persist_timeout_s)
        # (group, reason) of durable pushes answered without their persistence, not yet in Valkey.
        self._unpersisted: Counter[tuple[str, str]] = Counter()

    def __repr__(self) -> str:
        mode = "direct" if self.direct_backend else "queued"
        return (
            f"<Producer {self.producer_id} {mode} waiting={len(self._waiters)} "
            f"submitted={self.stats.submitted} completed={self.stats.completed} "
            f"late_replies={self.stats.late_replies}>"
        )

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self.direct_backend is not None:
            return
        await self._mark_alive()
        self._tasks = [
            asyncio.create_task(self._keep_alive(), name=f"alive:{self.producer_id}"),
            asyncio.create_task(self._pump_replies(), name=f"pump:{self.producer_id}"),
        ]

    async def close(self) -> None:
        """Stops refreshing liveness, deletes the marker, and fails every waiter with ProducerClosed."""
        if self._closed:
            return
        self._closed = True
        await self._stop_tasks()
        closed_reply = Reply(
            "", "error", error_type=ProducerClosed.error_type, error_message="producer closed"
        )
        for waiter in self._waiters.values():
            if not waiter.future.done():
                waiter.future.set_exception(ProducerClosed(f"producer {self.producer_id} closed"))
        self._waiters.clear()
        for inbox in self._streams.values():
            inbox.put_nowait(closed_reply)
        if self.direct_backend is None:
            with contextlib.suppress(*REDIS_ERRORS):
                await self._flush_unpersisted()
            with contextlib.suppress(*REDIS_ERRORS):
                await self.client.delete(
                    self._alive_key,
                    self.keys.replies_taken(self.producer_id),
                    self.keys.replies_acked(self.producer_id),
                )
        if self._backends is not None:
            await self._backends.aclose()
        await self.persistence.aclose()

    async def _stop_tasks(self) -> None:
        # A BLPOP cancelled mid-wait can leave redis-py's connection hanging, so the pump is woken
        # with a sentinel and left to return by itself; cancellation is only the fallback.
        if not self._tasks:
            return
        self._closing.set()
        with contextlib.suppress(*REDIS_ERRORS):
            await self.client.rpush(self._reply_key, _WAKE_SENTINEL)
        _, stuck = await asyncio.wait(self._tasks, timeout=2.0)
        for task in stuck:
            task.cancel()
        if stuck:
            await asyncio.wait(stuck, timeout=1.0)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def submit(
        self,
        call: ChatCall | Mapping[str, Any],
        *,
        pool_id: str,
        metadata: Metadata | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
        key: KeyLimits | None = None,
    ) -> CompletionResult:
        """Runs one chat completion through ``pool_id``; returns it or raises a DispatchError.

        Cancelling the caller withdraws the request: still queued, it is taken out of its list and never
        runs; already running, its dispatcher is told to cut the backend call off. ``key`` (an ingress
        key's limits) is admitted with the push, over the whole fleet; a refusal is QueueFull.
        """
        if self._closed or not self._started:
            raise ProducerClosed(
                f"producer {self.producer_id} is {'closed' if self._closed else 'not started'}"
            )
        chat = call if isinstance(call, ChatCall) else ChatCall.from_openai(call)
        timeout_s = self.settings.default_timeout_s if timeout is None else timeout
        request_id = request_id or uuid.uuid4().hex
        metadata = metadata or Metadata()
        span = self._submit_span(request_id, pool_id, chat.model, metadata)
        self.stats.submitted += 1
        try:
            backend = self.direct_backend or await self._route(pool_id)
            if backend is not None:
                with self._direct_slot(key, pool_id):
                    result = await self._submit_direct(backend, chat, request_id, pool_id, timeout_s)
            else:
                lease = self._lease(key, pool_id, request_id, timeout_s)
                result = await self._submit_queued(
                    chat, request_id, pool_id, metadata, timeout_s, span, lease
                )
        except QueueFull as exc:
            self.stats.rejected += 1
            _refused_span(span, exc)
            raise
        except DispatchError as exc:
            self.stats.failed += 1
            _fail_span(span, exc)
            raise
        finally:
            span.end()
        self.stats.completed += 1
        return result

    async def _submit_direct(
        self, backend: OpenAIBackend, chat: ChatCall, request_id: str, pool_id: str, timeout_s: float
    ) -> CompletionResult:
        started = time.monotonic()
        completion = await backend.complete(chat.to_openai(), timeout_s=timeout_s)
        elapsed = time.monotonic() - started
        return CompletionResult(request_id, pool_id, completion.body, Timing(0.0, elapsed, elapsed))

    async def _submit_queued(
        self,
        chat: ChatCall,
        request_id: str,
        pool_id: str,
        metadata: Metadata,
        timeout_s: float,
        span: trace.Span,
        lease: KeyLease | None = None,
    ) -> CompletionResult:
        raw = self._envelope(chat, request_id, pool_id, metadata, timeout_s, span)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        self._waiters[request_id] = _Waiter(future, pool_id)
        timer: asyncio.TimerHandle | None = None
        try:
            await self._push(pool_id, request_id, raw, lease, timeout_s)
            # A timer on the reply's own future rather than asyncio.wait_for, which adds a second future,
            # done callbacks and its own timer to every submit.
            timer = loop.call_at(loop.time() + timeout_s, _expire, future)
            try:
                reply = await future
            except TimeoutError:
                self.stats.timed_out += 1
                raise RequestTimeout(
                    f"request {request_id} to pool {pool_id!r} got no reply within {timeout_s:g}s"
                ) from None
        except asyncio.CancelledError:
            # Cancelled while the push was on its way too: the push was written, so the withdrawal that
            # follows it on the connection finds the request queued (it was left behind before).
            if await self.withdraw(pool_id, request_id, raw):
                _withdrawn_span(span)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self._waiters.pop(request_id, None)
            if lease is not None:
                await self._key_leases.release(lease)
        if not reply.ok:
            raise reply_error(reply)
        assert reply.completion is not None
        return CompletionResult(request_id, pool_id, reply.completion, reply.timing)

    def _envelope(
        self,
        chat: ChatCall,
        request_id: str,
        pool_id: str,
        metadata: Metadata,
        timeout_s: float,
        span: trace.Span,
        stream: StreamOptions | None = None,
    ) -> bytes:
        carrier: dict[str, str] = {}
        _propagator.inject(carrier, context=trace.set_span_in_context(span))
        now = time.time()
        envelope = Envelope(
            request_id=request_id,
            producer_id=self.producer_id,
            pool_id=pool_id,
            call=chat,
            enqueued_at=now,
            deadline=now + timeout_s,
            trace=carrier,
            metadata=metadata,
            stream=stream,
        )
        return envelope.encode(max_bytes=self.settings.max_envelope_bytes)

    async def _push(
        self, pool_id: str, request_id: str, raw: bytes, lease: KeyLease | None = None, timeout_s: float = 0.0
    ) -> None:
        """Queues the envelope; QueueFull (nothing queued) when the pool's admission limits, or those of
        the ingress key holding ``lease``, refuse it."""
        limits = self._admission_limits(pool_id)
        group = self._registry.groups.get(self._registry.pools.get(pool_id, ""))
        try:
            if group is not None and group.durable:
                await self._push_persisted(pool_id, raw, limits, group, lease)
                if lease is not None:
                    self._key_leases.hold(lease, timeout_s)
                return
            if limits.bounded or lease is not None:
                # The limits are checked and the request pushed (and counted against its key) in one
                # script: racing producers never take the queue past max_queued, nor a key past its own.
                await admit_and_push(self._admit_script, self.keys, pool_id, raw, limits, lease)
                if lease is not None:
                    self._key_leases.hold(lease, timeout_s)
                return
            # One script: the push, and a wake-up token only when the list was empty (wake one, not all).
            await self._push_script(
                keys=[self.keys.requests(pool_id), self.keys.wake_list(pool_id)],
                args=[raw, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS],
            )
        except REDIS_ERRORS as exc:
            raise QueueUnavailable(f"could not enqueue request {request_id}: {exc}") from exc

    async def _push_persisted(
        self,
        pool_id: str,
        raw: bytes,
        limits: AdmissionLimits,
        group: GroupConfig,
        lease: KeyLease | None = None,
    ) -> None:
        """A durable group's push: answered once Valkey has it persisted (runtime.valkey.persisted)."""
        admitted = limits.bounded or lease is not None
        if admitted:
            script, (script_keys, args) = _ADMIT_PUSH, admission_args(self.keys, pool_id, raw, limits, lease)
        else:
            script_keys = [self.keys.requests(pool_id), self.keys.wake_list(pool_id)]
            script, args = _PUSH, [raw, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS]
        replicas = group.persist_replicas
        result, outcome = await self.persistence.push(script, script_keys, args, replicas=replicas)
        if admitted and int(result[0]) != 1:
            raise queue_full(pool_id, limits, result, lease.limits if lease is not None else None)
        if outcome != PERSISTED:
            self.stats.unpersisted_pushes += 1
            self._unpersisted[(group.group_id, outcome)] += 1

    def stream(
        self,
        call: ChatCall | Mapping[str, Any],
        *,
        pool_id: str,
        metadata: Metadata | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
        include_usage: bool | None = None,
        key: KeyLimits | None = None,
    ) -> ChatStream:
        """Streams one chat completion through ``pool_id``: ``async for chunk in producer.stream(...)``
        yields OpenAI ``chat.completion.chunk`` objects as the backend sends them.

        ``call`` may be the SDK's streaming params as they are: their ``stream_options.include_usage``
        asks for the final usage chunk unless ``include_usage`` says otherwise.

        The dispatcher relays each chunk through this producer's reply list; errors before or during the
        stream raise the typed errors ``submit`` raises. Leaving the loop early (or cancelling it)
        withdraws the request like a cancelled ``submit``.
        """
        if self._closed or not self._started:
            raise ProducerClosed(
                f"producer {self.producer_id} is {'closed' if self._closed else 'not started'}"
            )
        if not isinstance(call, ChatCall):
            if include_usage is None:
                options = call.get("stream_options")
                include_usage = isinstance(options, Mapping) and options.get("include_usage") is True
            # This method is the stream switch: the body's own OpenAI streaming fields are not needed.
            call = ChatCall.from_openai(
                {k: v for k, v in call.items() if k not in ("stream", "stream_options")}
            )
        return ChatStream(
            self,
            call,
            pool_id=pool_id,
            metadata=metadata or Metadata(),
            timeout_s=self.settings.default_timeout_s if timeout is None else timeout,
            request_id=request_id or uuid.uuid4().hex,
            include_usage=bool(include_usage),
            key=key,
        )

    async def _stream_events(self, stream: ChatStream) -> AsyncIterator[Mapping[str, Any]]:
        pool_id, request_id = stream.pool_id, stream.request_id
        self.stats.submitted += 1
        backend = self.direct_backend or await self._route(pool_id)
        if backend is not None:
            body = {**stream.call.to_openai(), "stream_options": {"include_usage": stream.include_usage}}
            with self._direct_slot(stream.key, pool_id):
                async with contextlib.aclosing(backend.stream(body)) as chunks:  # type: ignore[type-var]
                    async for chunk in chunks:
                        yield chunk
            self.stats.completed += 1
            return
        span = self._submit_span(request_id, pool_id, stream.call.model, stream.metadata)
        try:
            async with contextlib.aclosing(self._queued_stream(stream, span)) as events:  # type: ignore[type-var]
                async for event in events:
                    yield event
        except QueueFull as exc:
            self.stats.rejected += 1
            _refused_span(span, exc)
            raise
        except DispatchError as exc:
            _fail_span(span, exc)
            raise
        finally:
            span.end()

    async def _queued_stream(self, stream: ChatStream, span: trace.Span) -> AsyncIterator[Mapping[str, Any]]:
        pool_id, request_id = stream.pool_id, stream.request_id
        raw = self._envelope(
            stream.call, request_id, pool_id, stream.metadata, stream.timeout_s, span,
            StreamOptions(include_usage=stream.include_usage),
        )  # fmt: skip
        lease = self._lease(stream.key, pool_id, request_id, stream.timeout_s)
        inbox: asyncio.Queue[Reply | StreamChunk] = asyncio.Queue()
        self._streams[request_id] = inbox
        finished = pushed = False
        try:
            await self._push(pool_id, request_id, raw, lease, stream.timeout_s)
            pushed = True
            deadline = time.monotonic() + stream.timeout_s
            while True:
                try:
                    # Not asyncio.wait_for: on Python 3.11 it returns a chunk that arrived in the same loop
                    # turn as a cancellation and drops the cancellation, so a client that left mid-stream
                    # kept its backend call running.
                    async with asyncio.timeout(deadline - time.monotonic()):
                        item = await inbox.get()
                except TimeoutError:
                    self.stats.timed_out += 1
                    raise RequestTimeout(
                        f"streamed request {request_id} to pool {pool_id!r} did not finish within "
                        f"{stream.timeout_s:g}s"
                    ) from None
                if isinstance(item, StreamChunk):
                    if item.queue_wait_s is not None:
                        stream.queue_wait_s = item.queue_wait_s
                    yield item.chunk
                    continue
                finished = True
                stream.timing = item.timing
                if not item.ok:
                    self.stats.failed += 1
                    raise reply_error(item)
                self.stats.completed += 1
                return
        finally:
            self._streams.pop(request_id, None)
            if pushed and not finished and await self.withdraw(pool_id, request_id, raw):
                _withdrawn_span(span)
            if lease is not None:
                await self._key_leases.release(lease)

    async def withdraw(self, pool_id: str, request_id: str, raw: bytes) -> bool:
        """Takes a queued request back out of its list, or its retry out of the pool's delayed set
        (counted ``dropped:cancelled`` in its group); one a dispatcher already claimed is cancelled
        through the group's cancel channel. True when it was still queued (no dispatcher will record
        it: its submit span does)."""
        self.stats.cancelled += 1
        group_id = self._registry.pools.get(pool_id)
        try:
            # Taken out and counted in one script: nobody sees the queue without it and the count not yet.
            counters = [self.keys.counters(group_id)] if group_id else []
            removed = await self._withdraw_script(
                keys=[self.keys.requests(pool_id), self.keys.delayed(pool_id), *counters],
                args=[raw, f"dropped:{Cancelled.error_type}", envelope_prefix(request_id, self.producer_id)],
            )
            if group_id and not removed:
                await self.client.publish(self.keys.cancel_channel(group_id), request_id.encode())
        except REDIS_ERRORS as exc:
            log.warning("producer %s could not withdraw request %s: %s", self.producer_id, request_id, exc)
            return False
        if removed:
            self.stats.withdrawn_queued += 1
        return bool(removed)

    def _submit_span(self, request_id: str, pool_id: str, model: str, metadata: Metadata) -> trace.Span:
        """The producer's span of one request: its history row when no dispatcher writes one (refused at
        submit, withdrawn while queued); the parent of the dispatcher's span otherwise."""
        group_id = self._registry.pools.get(pool_id, "")
        attributes = {
            semconv.REQUEST_ID: request_id,
            semconv.PRODUCER_ID: self.producer_id,
            semconv.POOL_ID: pool_id,
            semconv.GEN_AI_REQUEST_MODEL: model,
            semconv.SPAN_KIND_ROLE: "producer",
            **{f"{semconv.LABEL_PREFIX}{label}": value for label, value in metadata.labels.items()},
        }
        if group_id:
            attributes[semconv.GROUP_ID] = group_id
        return self._tracer.start_span(
            semconv.SPAN_NAME_SUBMIT, kind=trace.SpanKind.PRODUCER, attributes=attributes
        )

    def _lease(
        self, key: KeyLimits | None, pool_id: str, request_id: str, timeout_s: float
    ) -> KeyLease | None:
        if key is None or not key.bounded:
            return None
        return self._key_leases.lease(key, lease_member(pool_id, request_id), timeout_s)

    @contextlib.contextmanager
    def _direct_slot(self, key: KeyLimits | None, pool_id: str) -> Iterator[None]:
        """A key's most-in-flight on the direct path (no queue: nothing is queued, nothing shared)."""
        if key is None or key.max_in_flight is None:
            yield
            return
        open_now = self._direct_open[key.key_id]
        if open_now >= key.max_in_flight:
            raise QueueFull(
                key.describe(REASON_KEY_IN_FLIGHT, open_now), pool_id=pool_id, reason=REASON_KEY_IN_FLIGHT,
                depth=open_now, limit=float(key.max_in_flight),
            )  # fmt: skip
        self._direct_open[key.key_id] += 1
        try:
            yield
        finally:
            self._direct_open[key.key_id] -= 1

    async def _route(self, pool_id: str) -> OpenAIBackend | None:
        """None to queue the request; the backend to call when the pool's group has queueing disabled.

        Refuses a pool no fabric group has; the check is skipped while no configuration is published.
        """
        group = await self.pool_group(pool_id)
        if group is None or group.queueing_enabled:
            return None
        if self._backends is None:
            self._backends = BackendPool()
        key_env = group.api_key_env_for(pool_id)
        api_key = self.secrets.get(key_env) if key_env else None
        route = group.route(pool_id)
        if route.backend is None:
            return self._backends.get(route.endpoint, api_key)
        return self._backends.get(
            route.endpoint,
            api_key,
            timeout_s=route.backend.timeout_s,
            connect_timeout_s=route.backend.connect_timeout_s,
        )

    async def pool_group(self, pool_id: str) -> GroupConfig | None:
        """The published configuration of the group serving ``pool_id``; UnknownPool if no group has it.

        None while nothing is published (the check is then skipped).
        """
        registry = self._registry
        if time.monotonic() - registry.read_at > self.settings.pool_registry_refresh_s or (
            registry.pools and pool_id not in registry.pools
        ):
            registry = await self._fresh_registry()
        if registry.pools and pool_id not in registry.pools:
            known = ", ".join(sorted(registry.pools))
            raise UnknownPool(f"no fabric group has an enabled pool {pool_id!r} (known pools: {known})")
        return registry.groups.get(registry.pools.get(pool_id, ""))

    def _admission_limits(self, pool_id: str) -> AdmissionLimits:
        """The pool's limits as last published (read with the pool registry, every few seconds)."""
        return self._registry.limits.get(pool_id, _UNBOUNDED)

    async def _fresh_registry(self) -> _PoolRegistry:
        """The registry read again, one read at a time: every submit that finds it stale joins the read
        in flight. (Each used to start its own: with 2,000 calls in flight, a burst of 2,000 HGETALL and
        MGET round trips every refresh interval, a sixth of the producer's CPU.)

        The first caller reads in its own task (no extra task per read); the others wait for its result
        or its error.
        """
        while (pending := self._registry_read) is not None:
            try:
                # Shielded: a waiter cancelled meanwhile leaves the read to the others.
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not pending.cancelled() or (task is not None and task.cancelling()):
                    raise  # this caller was cancelled, not the reader
                # The reader was cancelled: read again, this caller first.
        read: asyncio.Future[_PoolRegistry] = asyncio.get_running_loop().create_future()
        self._registry_read = read
        try:
            registry = await self._read_registry()
        except Exception as exc:
            read.set_exception(exc)
            read.exception()  # retrieved: nobody may be waiting
            raise
        except BaseException:
            read.cancel()
            raise
        finally:
            self._registry_read = None
        read.set_result(registry)
        return registry

    async def _read_registry(self) -> _PoolRegistry:
        try:
            flat, group_ids, configs = await self._registry_script(
                keys=[self.keys.pool_registry()], args=[self.keys.group_config("")]
            )
            pools = {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)}
            group_ids = [_text(g) for g in group_ids]
        except REDIS_ERRORS as exc:
            raise QueueUnavailable(f"could not read the pool registry: {exc}") from exc
        groups = {}
        for group_id, config in zip(group_ids, configs, strict=True):
            with contextlib.suppress(MalformedEnvelope):
                if config:
                    groups[group_id] = GroupConfig.decode(config)
        pools, groups, source = self._with_last_known(pools, groups)
        limits = {}
        for pool_id, group_id in pools.items():
            pool = groups[group_id].pool(pool_id) if group_id in groups else None
            if pool is not None:
                limits[pool_id] = pool.admission_limits(groups[group_id].backend_for(pool_id))
        self._registry = _PoolRegistry(
            pools=pools, groups=groups, read_at=time.monotonic(), limits=limits, source=source
        )
        return self._registry

    def _with_last_known(
        self, pools: dict[str, str], groups: dict[str, GroupConfig]
    ) -> tuple[dict[str, str], dict[str, GroupConfig], str]:
        """What was read, with what Valkey lost filled in from the last read: a Valkey restarted empty
        must not switch admission limits and the unknown-pool check off until the configuration is
        republished (dispatchers do so from the database within seconds)."""
        previous = self._registry
        if not previous.pools:
            return pools, groups, "published" if pools else "none"
        if not pools:
            pools, groups = previous.pools, previous.groups
        lost = {g for g in pools.values() if g not in groups and g in previous.groups}
        if not lost and pools is not previous.pools:
            if previous.source == "last_known":
                log.warning("producer %s: the published configuration is back", self.producer_id)
            return pools, groups, "published"
        groups = {**groups, **{g: previous.groups[g] for g in lost}}
        self.stats.config_missing_reads += 1
        if previous.source != "last_known":
            log.warning(
                "producer %s: Valkey has lost the published configuration; submits are checked against "
                "the last known one until it is republished",
                self.producer_id,
            )
        return pools, groups, "last_known"

    @property
    def configuration(self) -> str:
        """Which configuration submits are checked against: published, last_known or none."""
        return self._registry.source

    async def _mark_alive(self) -> None:
        ttl_ms = int(self.settings.alive_ttl_s * 1000)
        await self.client.set(self._alive_key, b"1", px=ttl_ms)

    async def _keep_alive(self) -> None:
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.settings.alive_refresh_s)
            if self._closed:
                return
            try:
                await self._mark_alive()
                await self._key_leases.renew()
                await self._flush_unpersisted()
            except REDIS_ERRORS as exc:
                log.warning("producer %s could not refresh liveness: %s", self.producer_id, exc)

    async def _flush_unpersisted(self) -> None:
        """Adds the durable pushes answered without their persistence to their groups' counters
        (``unpersisted:<outcome>``, shown on the dashboard): with the liveness refresh, off the hot path."""
        pending, self._unpersisted = self._unpersisted, Counter()
        if not pending:
            return
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for (group_id, outcome), count in pending.items():
                    pipe.hincrby(self.keys.counters(group_id), f"unpersisted:{outcome}", count)
                await pipe.execute()
        except REDIS_ERRORS:
            self._unpersisted.update(pending)  # counted with the next refresh
            raise

    async def _pump_replies(self) -> None:
        # A connection of its own: the pump blocks on it, and a shared one would wait behind it.
        own = dedicated_connection(self.client)
        try:
            await self._pump(own)
        finally:
            with contextlib.suppress(*REDIS_ERRORS):
                await own.aclose()

    async def _pump(self, own: Any) -> None:
        backoff = Backoff(*PUMP_BACKOFF_S)
        taken_key = self.keys.replies_taken(self.producer_id)
        keys = [self._reply_key, taken_key, self.keys.replies_acked(self.producer_id)]
        ttl_ms = int(REPLY_LIST_TTL_S * 1000)
        # Above any sequence an earlier pump of the same producer_id acknowledged (a restarted process).
        seq, delivered = time.time_ns() // 1000, 0
        while not self._closed:
            try:
                # Up to a batch of replies per round trip: BLMOVE blocks for the first, the take moves the
                # rest (it runs right after, on this connection) and acknowledges the last batch.
                _, batch = await own.execute(
                    [
                        ("BLMOVE", self._reply_key, taken_key, "LEFT", "RIGHT", REPLY_BLOCK_S),
                        ("EVAL", _TAKE_REPLIES, len(keys), *keys, seq, delivered, REPLY_BATCH, ttl_ms),
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
                pause = backoff.next()
                log.warning(
                    "producer %s reply pump lost Valkey (%s); retrying in %.1fs", self.producer_id, exc, pause
                )
                await asyncio.sleep(pause)
                continue
            for raw in batch:
                self._deliver(raw)

    def _deliver(self, raw: bytes | str) -> None:
        if raw == _WAKE_SENTINEL:
            return
        try:
            reply = decode_reply_item(raw)
        except MalformedEnvelope as exc:
            self.stats.malformed_replies += 1
            log.warning("producer %s dropped a malformed reply: %s", self.producer_id, exc)
            return
        if reply.request_id in self._answered:
            self.stats.duplicate_replies += 1
            return
        inbox = self._streams.get(reply.request_id)
        if inbox is not None:
            inbox.put_nowait(reply)
            if isinstance(reply, Reply):
                self._remember_answered(reply.request_id)
            return
        if isinstance(reply, StreamChunk):
            self.stats.late_replies += 1
            return
        waiter = self._waiters.pop(reply.request_id, None)
        if waiter is None or waiter.future.done():
            self.stats.late_replies += 1
            return
        waiter.future.set_result(reply)
        self._remember_answered(reply.request_id)

    def _remember_answered(self, request_id: str) -> None:
        self._answered[request_id] = None
        if len(self._answered) > ANSWERED_MEMORY:
            self._answered.popitem(last=False)


@dataclass(slots=True)
class ChatStream:
    """One streamed call: iterate it for the chunks; ``queue_wait_s`` is known from the first chunk on,
    ``timing`` once the stream ended."""

    producer: Producer
    call: ChatCall
    pool_id: str
    metadata: Metadata
    timeout_s: float
    request_id: str
    include_usage: bool = False
    key: KeyLimits | None = None
    queue_wait_s: float | None = None
    timing: Timing | None = None

    def __aiter__(self) -> AsyncIterator[Mapping[str, Any]]:
        return self.producer._stream_events(self)


def _expire(future: asyncio.Future[Reply]) -> None:
    """A submit's timer: its reply did not come in time (a reply arriving later is counted late)."""
    if not future.done():
        future.set_exception(TimeoutError())


def reply_error(reply: Reply) -> DispatchError:
    """The typed error a failed reply describes, with the backend's status when it carries one."""
    error_type, message = reply.error_type or "dispatch_error", reply.error_message or ""
    backend = reply.backend
    if backend is None:
        return error_from_type(error_type, message)
    return error_from_type(
        error_type,
        message,
        status_code=backend.status,
        retry_after_s=backend.retry_after_s,
        backend_message=backend.message,
    )


def _refused_span(span: trace.Span, exc: QueueFull) -> None:
    # A history row of its own: refused at the door, with the admission limit's reason.
    span.set_attributes({semconv.STATUS: "rejected", semconv.DROP_REASON: exc.reason})
    _fail_span(span, exc)


def _withdrawn_span(span: trace.Span) -> None:
    """Withdrawn while queued: no dispatcher saw it, so this span is its history row."""
    span.set_attributes(
        {
            semconv.STATUS: "dropped",
            semconv.DROP_REASON: Cancelled.error_type,
            semconv.ERROR_TYPE: Cancelled.error_type,
        }
    )
    span.set_status(trace.Status(trace.StatusCode.ERROR, "withdrawn by its caller while queued"))


def _fail_span(span: trace.Span, exc: DispatchError) -> None:
    span.set_attribute(semconv.ERROR_TYPE, exc.error_type)
    span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))


class SyncProducer:
    """A blocking facade over :class:`Producer` for code that is not async.

    It runs its own event loop in a daemon thread; ``submit`` may be called from any thread.
    """

    def __init__(self, url: str, **producer_kwargs: Any) -> None:
        self._loop = eventloop.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="llm-dispatch-producer", daemon=True
        )
        self._thread.start()
        settings = producer_kwargs.get("settings") or ProducerSettings()
        self._client = connect(url, health_s=settings.valkey_health_s)
        self.producer = Producer(self._client, **producer_kwargs)
        self._run(self.producer.start())

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def submit(self, call: ChatCall | Mapping[str, Any], **kwargs: Any) -> CompletionResult:
        return self._run(self.producer.submit(call, **kwargs))

    def close(self) -> None:
        self._run(self.producer.close())
        self._run(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _text(value: bytes | str) -> str:
    """The client returns bytes (no ``decode_responses``); accept str for clients configured otherwise."""
    return value.decode() if isinstance(value, bytes) else value
