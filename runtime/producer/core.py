"""The producer client: submit a chat completion to a pool and get the completion back.

Its parts live beside it: the pool registry (:mod:`~runtime.producer.pools`), the push
(:mod:`~runtime.producer.enqueue`), the wait for a queued reply (:mod:`~runtime.producer.queued`), the
reply pump (:mod:`~runtime.producer.pump`), the liveness heartbeat (:mod:`~runtime.producer.liveness`),
the direct path (:mod:`~runtime.producer.direct`), streamed calls (:mod:`~runtime.producer.streams`)
and the blocking client (:mod:`~runtime.producer.sync`). It speaks to the queue only through
:mod:`runtime.queue`, never through the dispatcher's modules.

One :class:`Producer` owns one ``producer_id``. While it can receive replies it keeps
``key:llm:producer:{producer_id}:alive`` fresh; a single reply pump drains
``list:llm:replies:{producer_id}`` and hands each reply to the waiter with that ``request_id``, so
thousands of concurrent submits share one connection. A submit that times out or is cancelled
removes its waiter; a reply arriving for it later is counted as late and discarded.

When the pool's fabric group has queueing disabled in the admin (or ``direct_backend`` is set),
``submit`` calls the backend itself, skipping the queue and the dispatchers, and returns the same
:class:`~runtime.producer.outcomes.CompletionResult` shape (zero queue wait), raising the same typed errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis
from opentelemetry import trace

from runtime.backends.adapter import OpenAIBackend
from runtime.config import ProducerSettings
from runtime.errors import (
    DispatchError,
    ProducerClosed,
    QueueFull,
)
from runtime.policy.admission import KeyLimits
from runtime.producer.direct import DirectPath
from runtime.producer.enqueue import Enqueuer
from runtime.producer.liveness import Liveness
from runtime.producer.outcomes import (
    CompletionResult,
    ProducerStats,
    fail_span,
    refused_span,
    submit_span,
)
from runtime.producer.pools import PoolRegistry
from runtime.producer.pump import WAKE_SENTINEL, ReplyPump
from runtime.producer.queued import submit_queued
from runtime.producer.streams import ChatStream, stream_call
from runtime.producer.tenancy import UNTAGGED_TAG, TenantTag, tag_span, withdraw_member
from runtime.queue.keys import DEFAULT_KEYS, KeySpace
from runtime.valkey.client import REDIS_ERRORS
from runtime.wire.contract import (
    Call,
    ChatCall,
    CompletionsCall,
    EmbeddingsCall,
    Metadata,
    Reply,
)
from runtime.wire.groupconfig import GroupConfig, ModelAlias

__all__ = ["Producer"]

CALLS = (ChatCall, EmbeddingsCall, CompletionsCall)

log = logging.getLogger(__name__)


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
        self._direct = DirectPath(self.secrets)
        self.stats = ProducerStats()
        self._tracer = tracer or trace.get_tracer("llm_dispatch.producer")
        self._replies = ReplyPump(client, keys, self.producer_id, self.stats)
        self._waiters = self._replies.waiters
        self._tasks: list[asyncio.Task[None]] = []
        self._pools = PoolRegistry(
            client,
            keys,
            self.settings.pool_registry_refresh_s,
            self.stats,
            owner=f"producer {self.producer_id}",
        )
        self._started = False
        self._closed = False
        self._reply_key = keys.replies(self.producer_id)
        self._enqueue = Enqueuer(
            client,
            keys,
            producer_id=self.producer_id,
            settings=self.settings,
            pools=self._pools,
            stats=self.stats,
        )
        self._queue = self._enqueue.queue
        self._key_leases = self._enqueue.key_leases
        self.persistence = self._enqueue.persistence
        self._liveness = Liveness(self._enqueue)

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
        await self._liveness.mark_alive()
        self._tasks = [
            asyncio.create_task(self._liveness.run(), name=f"alive:{self.producer_id}"),
            asyncio.create_task(self._replies.run(), name=f"pump:{self.producer_id}"),
        ]

    async def close(self) -> None:
        """Stops refreshing liveness, deletes the marker, and fails every waiter with ProducerClosed."""
        if self._closed:
            return
        self._closed = self._replies.closed = True
        self._liveness.stop()
        await self._stop_tasks()
        closed_reply = Reply(
            "", "error", error_type=ProducerClosed.error_type, error_message="producer closed"
        )
        for waiter in self._waiters.values():
            if not waiter.future.done():
                waiter.future.set_exception(ProducerClosed(f"producer {self.producer_id} closed"))
        self._waiters.clear()
        for inbox in self._replies.streams.values():
            inbox.put_nowait(closed_reply)
        if self.direct_backend is None:
            with contextlib.suppress(*REDIS_ERRORS):
                await self._enqueue.flush_unpersisted()
            with contextlib.suppress(*REDIS_ERRORS):
                await self._liveness.forget()
        await self._direct.aclose()
        await self.persistence.aclose()

    async def _stop_tasks(self) -> None:
        # A BLPOP cancelled mid-wait can leave redis-py's connection hanging, so the pump is woken
        # with a sentinel and left to return by itself; cancellation is only the fallback.
        if not self._tasks:
            return
        with contextlib.suppress(*REDIS_ERRORS):
            await self.client.rpush(self._reply_key, WAKE_SENTINEL)
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
        call: Call | Mapping[str, Any],
        *,
        pool_id: str,
        metadata: Metadata | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
        key: KeyLimits | None = None,
        tenant: str | None = None,
        tenant_weight: float = 1.0,
    ) -> CompletionResult:
        """Runs one call through ``pool_id``; returns its answer or raises a DispatchError.

        ``call`` is a chat completion (a :class:`ChatCall`, or the SDK's request dict as it is), or an
        :class:`EmbeddingsCall` / :class:`CompletionsCall` (:meth:`embed` and :meth:`complete` take
        those endpoints' request dicts).

        Cancelling the caller withdraws the request: still queued, it is taken out of its list and never
        runs; already running, its dispatcher is told to cut the backend call off. ``key`` (an ingress
        key's limits) is admitted with the push, over the whole fleet; a refusal is QueueFull. ``tenant``
        (weighted by ``tenant_weight``) is who the request is fair to inside a pool with
        ``tenant_fairness`` on; a tenant at the pool's ``max_queued_per_tenant`` is QueueFull.
        """
        if self._closed or not self._started:
            raise ProducerClosed(
                f"producer {self.producer_id} is {'closed' if self._closed else 'not started'}"
            )
        chat = call if isinstance(call, CALLS) else ChatCall.from_openai(call)
        tag = UNTAGGED_TAG if tenant is None and tenant_weight == 1.0 else TenantTag.of(tenant, tenant_weight)
        timeout_s = self.settings.default_timeout_s if timeout is None else timeout
        request_id = request_id or uuid.uuid4().hex
        metadata = metadata or Metadata()
        span = self._submit_span(request_id, pool_id, chat.model, metadata)
        tag_span(span, tag)
        self.stats.submitted += 1
        try:
            backend = self.direct_backend or await self._route(pool_id)
            if backend is not None:
                with self._direct.slot(key, pool_id):
                    result = await self._direct.complete(backend, chat, request_id, pool_id, timeout_s)
            else:
                lease = self._enqueue.lease(key, pool_id, request_id, timeout_s)
                result = await submit_queued(
                    self, chat, request_id, pool_id, metadata, timeout_s, span, lease, tag
                )
        except QueueFull as exc:
            self.stats.rejected += 1
            refused_span(span, exc)
            raise
        except DispatchError as exc:
            self.stats.failed += 1
            fail_span(span, exc)
            raise
        finally:
            span.end()
        self.stats.completed += 1
        return result

    async def embed(self, call: EmbeddingsCall | Mapping[str, Any], **kwargs: Any) -> CompletionResult:
        """``POST /v1/embeddings`` through the queue: ``call`` is the SDK's ``embeddings.create`` params
        (or an EmbeddingsCall); the answer is a ``CreateEmbeddingResponse`` body. ``submit``'s kwargs."""
        return await self.submit(EmbeddingsCall.of(call), **kwargs)

    async def complete(self, call: CompletionsCall | Mapping[str, Any], **kwargs: Any) -> CompletionResult:
        """A legacy ``POST /v1/completions`` (a ``text_completion`` back); ``submit``'s kwargs."""
        return await self.submit(CompletionsCall.of(call), **kwargs)

    def stream_completion(self, call: CompletionsCall | Mapping[str, Any], **kwargs: Any) -> ChatStream:
        """Streams a legacy completion (``text_completion`` chunks); ``stream``'s kwargs."""
        completion, include_usage = stream_call(call, kwargs.pop("include_usage", None), CompletionsCall)
        return self.stream(completion, include_usage=include_usage, **kwargs)

    def stream(
        self,
        call: ChatCall | CompletionsCall | Mapping[str, Any],
        *,
        pool_id: str,
        metadata: Metadata | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
        include_usage: bool | None = None,
        key: KeyLimits | None = None,
        tenant: str | None = None,
        tenant_weight: float = 1.0,
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
        call, include_usage = stream_call(call, include_usage)
        tag = UNTAGGED_TAG if tenant is None and tenant_weight == 1.0 else TenantTag.of(tenant, tenant_weight)
        return ChatStream(
            self,
            call,
            pool_id=pool_id,
            metadata=metadata or Metadata(),
            timeout_s=self.settings.default_timeout_s if timeout is None else timeout,
            request_id=request_id or uuid.uuid4().hex,
            include_usage=bool(include_usage),
            key=key,
            tag=tag,
        )

    async def withdraw(
        self, pool_id: str, request_id: str, raw: bytes, tag: TenantTag = UNTAGGED_TAG
    ) -> bool:
        """Takes a queued request back out of its list, or its retry out of the pool's delayed set
        (counted ``dropped:cancelled`` in its group); one a dispatcher already claimed is cancelled
        through the group's cancel channel. True when it was still queued (no dispatcher will record
        it: its submit span does)."""
        self.stats.cancelled += 1
        group_id = self._pools.group_of(pool_id)
        try:
            group = self._pools.view.groups.get(group_id or "")
            tenant = withdraw_member(group.pool(pool_id) if group is not None else None, tag)
            removed = await self._queue.withdraw(pool_id, request_id, self.producer_id, raw, group_id, tenant)
        except REDIS_ERRORS as exc:
            log.warning("producer %s could not withdraw request %s: %s", self.producer_id, request_id, exc)
            return False
        if removed:
            self.stats.withdrawn_queued += 1
        return removed

    def _submit_span(self, request_id: str, pool_id: str, model: str, metadata: Metadata) -> trace.Span:
        group_id = self._pools.group_of(pool_id) or ""
        return submit_span(self._tracer, self.producer_id, group_id, request_id, pool_id, model, metadata)

    async def _route(self, pool_id: str) -> OpenAIBackend | None:
        """None to queue the request; the backend to call when the pool's group has queueing disabled.

        Refuses a pool no fabric group has; the check is skipped while no configuration is published.
        """
        group = await self._pools.pool_group(pool_id)
        if group is None or group.queueing_enabled:
            return None
        return self._direct.backend(group, pool_id)

    async def pool_group(self, pool_id: str) -> GroupConfig | None:
        """The published configuration of the group serving ``pool_id``; UnknownPool if no group has it.

        None while nothing is published (the check is then skipped).
        """
        return await self._pools.pool_group(pool_id)

    async def model_aliases(self) -> Mapping[str, ModelAlias]:
        """Every published model alias of an enabled pool, by the name clients send as ``model``."""
        return await self._pools.aliases()

    @property
    def configuration(self) -> str:
        """Which configuration submits are checked against: published, last_known or none."""
        return self._pools.view.source
