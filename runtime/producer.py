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
from collections import OrderedDict
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis.asyncio as aioredis
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from runtime import eventloop
from runtime.backends.adapter import BackendPool, OpenAIBackend
from runtime.backoff import Backoff
from runtime.config import ProducerSettings
from runtime.dispatch.admission import ADMIT_PUSH, admit_and_push
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
from runtime.policy.admission import AdmissionLimits
from runtime.telemetry import semconv
from runtime.valkey.client import REDIS_ERRORS, connect, dedicated_connection
from runtime.valkey.lua import LuaScript
from runtime.wire.contract import (
    ChatCall,
    Envelope,
    Metadata,
    Reply,
    StreamChunk,
    StreamOptions,
    Timing,
    decode_reply_item,
)
from runtime.wire.groupconfig import GroupConfig
from runtime.wire.keys import DEFAULT_KEYS, KeySpace

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
# KEYS: the pool's list and, when its group is known, the group's counters; ARGV: the envelope, the
# counter's field. Removes the queued request and counts it; returns how many were removed.
_WITHDRAW = LuaScript(
    """
local removed = redis.call('LREM', KEYS[1], 1, ARGV[1])
if removed > 0 and KEYS[2] then redis.call('HINCRBY', KEYS[2], ARGV[2], 1) end
return removed
"""
)
REPLY_BATCH = 512  # most replies the pump takes per round trip
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
    late_replies: int = 0
    duplicate_replies: int = 0  # a second reply for a request already answered (discarded)
    malformed_replies: int = 0
    pump_reconnects: int = 0


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
                await self.client.delete(self._alive_key)
        if self._backends is not None:
            await self._backends.aclose()

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
    ) -> CompletionResult:
        """Runs one chat completion through ``pool_id``; returns it or raises a DispatchError.

        Cancelling the caller withdraws the request: still queued, it is taken out of its list and never
        runs; already running, its dispatcher is told to cut the backend call off.
        """
        if self._closed or not self._started:
            raise ProducerClosed(
                f"producer {self.producer_id} is {'closed' if self._closed else 'not started'}"
            )
        chat = call if isinstance(call, ChatCall) else ChatCall.from_openai(call)
        timeout_s = self.settings.default_timeout_s if timeout is None else timeout
        request_id = request_id or uuid.uuid4().hex
        span = self._tracer.start_span(
            semconv.SPAN_NAME_SUBMIT,
            kind=trace.SpanKind.PRODUCER,
            attributes={
                semconv.REQUEST_ID: request_id,
                semconv.PRODUCER_ID: self.producer_id,
                semconv.POOL_ID: pool_id,
                semconv.GEN_AI_REQUEST_MODEL: chat.model,
                semconv.SPAN_KIND_ROLE: "producer",
            },
        )
        self.stats.submitted += 1
        try:
            backend = self.direct_backend or await self._route(pool_id)
            if backend is not None:
                result = await self._submit_direct(backend, chat, request_id, pool_id, timeout_s)
            else:
                result = await self._submit_queued(
                    chat, request_id, pool_id, metadata or Metadata(), timeout_s, span
                )
        except QueueFull as exc:
            self.stats.rejected += 1
            # A history row of its own: refused at the door, with the admission limit's reason.
            span.set_attributes({semconv.STATUS: "rejected", semconv.DROP_REASON: exc.reason})
            _fail_span(span, exc)
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
    ) -> CompletionResult:
        raw = self._envelope(chat, request_id, pool_id, metadata, timeout_s, span)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        self._waiters[request_id] = _Waiter(future, pool_id)
        timer: asyncio.TimerHandle | None = None
        try:
            await self._push(pool_id, request_id, raw)
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
            await self.withdraw(pool_id, request_id, raw)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self._waiters.pop(request_id, None)
        if not reply.ok:
            raise error_from_type(reply.error_type or "dispatch_error", reply.error_message or "")
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

    async def _push(self, pool_id: str, request_id: str, raw: bytes) -> None:
        """Queues the envelope; QueueFull (nothing queued) when the pool's admission limits refuse it."""
        limits = self._admission_limits(pool_id)
        try:
            if limits.bounded:
                # The limits are checked and the request pushed in one script: racing producers
                # never take the queue past max_queued.
                await admit_and_push(self._admit_script, self.keys, pool_id, raw, limits)
                return
            # One script: the push, and a wake-up token only when the list was empty (wake one, not all).
            await self._push_script(
                keys=[self.keys.requests(pool_id), self.keys.wake_list(pool_id)],
                args=[raw, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS],
            )
        except REDIS_ERRORS as exc:
            raise QueueUnavailable(f"could not enqueue request {request_id}: {exc}") from exc

    def stream(
        self,
        call: ChatCall | Mapping[str, Any],
        *,
        pool_id: str,
        metadata: Metadata | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
        include_usage: bool = False,
    ) -> ChatStream:
        """Streams one chat completion through ``pool_id``: ``async for chunk in producer.stream(...)``
        yields OpenAI ``chat.completion.chunk`` objects as the backend sends them.

        The dispatcher relays each chunk through this producer's reply list; errors before or during the
        stream raise the typed errors ``submit`` raises. Leaving the loop early (or cancelling it)
        withdraws the request like a cancelled ``submit``.
        """
        if self._closed or not self._started:
            raise ProducerClosed(
                f"producer {self.producer_id} is {'closed' if self._closed else 'not started'}"
            )
        if not isinstance(call, ChatCall):
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
            include_usage=include_usage,
        )

    async def _stream_events(self, stream: ChatStream) -> AsyncIterator[Mapping[str, Any]]:
        pool_id, request_id = stream.pool_id, stream.request_id
        self.stats.submitted += 1
        backend = self.direct_backend or await self._route(pool_id)
        if backend is not None:
            body = {**stream.call.to_openai(), "stream_options": {"include_usage": stream.include_usage}}
            async with contextlib.aclosing(backend.stream(body)) as chunks:  # type: ignore[type-var]
                async for chunk in chunks:
                    yield chunk
            self.stats.completed += 1
            return
        with self._tracer.start_as_current_span(
            semconv.SPAN_NAME_SUBMIT, kind=trace.SpanKind.PRODUCER
        ) as span:
            span.set_attributes({semconv.REQUEST_ID: request_id, semconv.POOL_ID: pool_id})
            raw = self._envelope(
                stream.call, request_id, pool_id, stream.metadata, stream.timeout_s, span,
                StreamOptions(include_usage=stream.include_usage),
            )  # fmt: skip
        inbox: asyncio.Queue[Reply | StreamChunk] = asyncio.Queue()
        self._streams[request_id] = inbox
        finished = False
        try:
            await self._push(pool_id, request_id, raw)
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
                    raise error_from_type(item.error_type or "dispatch_error", item.error_message or "")
                self.stats.completed += 1
                return
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                await self.withdraw(pool_id, request_id, raw)

    async def withdraw(self, pool_id: str, request_id: str, raw: bytes) -> None:
        """Takes a queued request back out of its list (counted ``dropped:cancelled`` in its group);
        one a dispatcher already claimed is cancelled through the group's cancel channel."""
        self.stats.cancelled += 1
        group_id = self._registry.pools.get(pool_id)
        try:
            # Taken out and counted in one script: nobody sees the queue without it and the count not yet.
            counters = [self.keys.counters(group_id)] if group_id else []
            removed = await self._withdraw_script(
                keys=[self.keys.requests(pool_id), *counters], args=[raw, f"dropped:{Cancelled.error_type}"]
            )
            if group_id and not removed:
                await self.client.publish(self.keys.cancel_channel(group_id), request_id.encode())
        except REDIS_ERRORS as exc:
            log.warning("producer %s could not withdraw request %s: %s", self.producer_id, request_id, exc)

    async def _route(self, pool_id: str) -> OpenAIBackend | None:
        """None to queue the request; the backend to call when the pool's group has queueing disabled.

        Refuses a pool no fabric group has; the check is skipped while no configuration is published.
        """
        group = await self.pool_group(pool_id)
        if group is None or group.queueing_enabled:
            return None
        if self._backends is None:
            self._backends = BackendPool()
        api_key = self.secrets.get(group.api_key_env) if group.api_key_env else None
        return self._backends.get(group.endpoint_for(pool_id), api_key)

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
        limits = {}
        for pool_id, group_id in pools.items():
            pool = groups[group_id].pool(pool_id) if group_id in groups else None
            if pool is not None:
                limits[pool_id] = pool.admission_limits()
        self._registry = _PoolRegistry(pools=pools, groups=groups, read_at=time.monotonic(), limits=limits)
        return self._registry

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
            except REDIS_ERRORS as exc:
                log.warning("producer %s could not refresh liveness: %s", self.producer_id, exc)

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
        while not self._closed:
            try:
                # Up to a batch of replies per round trip: BLMPOP blocks for the first, takes the rest.
                [popped] = await own.execute(
                    [("BLMPOP", 1, 1, self._reply_key, "LEFT", "COUNT", REPLY_BATCH)]
                )
                if popped is None:
                    continue
                batch: list[bytes | str] = popped[1]
                backoff.reset()
            except REDIS_ERRORS as exc:
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
    queue_wait_s: float | None = None
    timing: Timing | None = None

    def __aiter__(self) -> AsyncIterator[Mapping[str, Any]]:
        return self.producer._stream_events(self)


def _expire(future: asyncio.Future[Reply]) -> None:
    """A submit's timer: its reply did not come in time (a reply arriving later is counted late)."""
    if not future.done():
        future.set_exception(TimeoutError())


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
        self._client = connect(url)
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
