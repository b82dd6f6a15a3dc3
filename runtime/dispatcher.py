"""The dispatcher engine: one process of a fabric group, started by ``manage.py rundispatcher``.

Each scheduling round observes every pool of the group in one pipeline, decodes the peeked heads,
asks the pure scheduler (:func:`runtime.scheduler.decide`) which heads may launch, and claims exactly
those with an atomic script (digest match, producer liveness, hard caps, in-flight lease). Each
claimed request runs in its own task and frees its slot the moment its own call ends. Nothing is
popped that cannot launch, so refused work stays visibly queued.

Failures are explicit and counted (see :mod:`runtime.stats`): malformed items, producers gone before
execution or before the reply, expired deadlines, backend errors by type. Valkey outages are
survived with capped exponential backoff; SIGTERM/SIGINT stop taking work, let in-flight calls
finish within the grace period, reply, and return.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis
from opentelemetry import trace

from runtime import groupconfig, scheduler
from runtime.adapter import BackendPool
from runtime.backend_health import EndpointBreakers
from runtime.config import DispatcherSettings
from runtime.contract import STATUS_ERROR, STATUS_OK, Envelope, Reply, Timing
from runtime.errors import BreakerOpen, DispatchError, Rejected, RequestExpired
from runtime.groupconfig import GroupConfig
from runtime.keys import DEFAULT_KEYS, KeySpace
from runtime.peek import PeekCache, PeekedItem
from runtime.producer import REDIS_ERRORS
from runtime.queue import ClaimRequest, QueueOps, QueueView, lease_member
from runtime.redact import redact_url
from runtime.snapshot import build_snapshot
from runtime.spans import Identity, Outcome, content_attributes, record_span
from runtime.stats import (
    DROP_EXPIRED,
    DROP_MALFORMED,
    DROP_PRODUCER_GONE,
    DROP_REPLY_PRODUCER_GONE,
    DROP_REPLY_UNDELIVERED,
    DispatcherStats,
)

log = logging.getLogger(__name__)
SnapshotSink = Callable[[dict[str, Any]], Awaitable[None]]
CONFIG_POLL_S = 1.0
HELPER_EXIT_S = 5.0
HEARTBEAT_S = 2.0


@dataclass(slots=True)
class Running:
    """One request this dispatcher is executing."""

    envelope: Envelope
    pool_id: str
    member: str
    cost: int
    started_at: float
    stage: str = "executing"


class Dispatcher:
    """Schedules one fabric group's pools onto their backends. ``await run()`` until stopped."""

    def __init__(
        self,
        client: aioredis.Redis,
        settings: DispatcherSettings,
        *,
        keys: KeySpace = DEFAULT_KEYS,
        backends: BackendPool | None = None,
        secrets: Mapping[str, str] | None = None,
        snapshot_sink: SnapshotSink | None = None,
        tracer: trace.Tracer | None = None,
        store_content: bool = False,
    ) -> None:
        self.client = client
        self.settings = settings
        self.keys = keys
        self.queue = QueueOps(client, keys, settings.group_id)
        self.backends = backends or BackendPool(
            timeout_s=settings.backend_timeout_s, connect_timeout_s=settings.backend_connect_timeout_s
        )
        self.secrets = dict(secrets or {})
        self.snapshot_sink = snapshot_sink
        self.tracer = tracer or trace.get_tracer("llm_dispatch.dispatcher")
        self.store_content = store_content
        self.identity = Identity(settings.group_id, settings.gateway_id, settings.dispatcher_id)
        self.stats = DispatcherStats()
        self.breakers = EndpointBreakers(settings.breaker)
        self.config: GroupConfig | None = None
        self.started_at = time.time()
        self.valkey_ok = True
        self.last_views: dict[str, QueueView] = {}
        self.group_in_flight = 0
        self.running: dict[str, Running] = {}
        self._policy: scheduler.GroupPolicy | None = None
        self._state = scheduler.SchedulerState()
        self._peek = PeekCache(settings.cost)
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._config_changed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._finished = asyncio.Event()  # set once in-flight calls are done: helpers then exit
        self._subscribed: frozenset[str] = frozenset()
        self._last_published: dict[str, Any] = {}
        self._last_published_at = 0.0

    def __repr__(self) -> str:
        return (
            f"<Dispatcher {self.identity.dispatcher_id} group={self.settings.group_id} "
            f"running={len(self.running)}/{self.settings.concurrency} completed={self.stats.completed} "
            f"dropped={sum(self.stats.dropped.values())} valkey={'up' if self.valkey_ok else 'down'}>"
        )

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def deficit(self, pool_id: str) -> int:
        return self._state.deficit(pool_id)

    def peeked_head(self, pool_id: str) -> PeekedItem | None:
        """The decoded head of a pool as last observed (served from the peek cache)."""
        view = self.last_views.get(pool_id)
        return self._peek.get(view.heads[0]) if view and view.heads else None

    # --- lifecycle --------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Stop taking new work; in-flight calls finish within the grace period."""
        if not self._stopping.is_set():
            log.info("dispatcher %s stopping: %d in flight", self.identity.dispatcher_id, len(self.running))
        self._stopping.set()
        self._wake.set()

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop)
        try:
            await self._wait_for_config()
            async with asyncio.TaskGroup() as group:
                helpers = [
                    group.create_task(self._listen()),
                    group.create_task(self._renew_leases()),
                    group.create_task(self._publish_snapshots()),
                ]
                await self._schedule_loop()
                await self._drain()
                # Helpers leave their loops on their own: cancelling redis-py mid-command can hang.
                self._finished.set()
                _, stuck = await asyncio.wait(helpers, timeout=HELPER_EXIT_S)
                for task in stuck:
                    task.cancel()
            await self._publish_snapshot_once()
        finally:
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            await self.backends.aclose()
            with contextlib.suppress(*REDIS_ERRORS):
                await self.client.delete(
                    self.keys.snapshot(self.settings.group_id, self.identity.dispatcher_id)
                )
                await self.queue.add_counters(self.stats.unflushed())

    async def _drain(self) -> None:
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=self.settings.shutdown_grace_s)
        for task in pending:
            task.cancel()
        if pending:
            log.warning(
                "dispatcher %s cancelled %d calls still running after the %.0fs grace period",
                self.identity.dispatcher_id,
                len(pending),
                self.settings.shutdown_grace_s,
            )
            await asyncio.wait(pending, timeout=5)

    async def _wait_for_config(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(*REDIS_ERRORS):
                if await self._reload_config():
                    return
            log.warning("no configuration published for fabric group %r yet; waiting", self.settings.group_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 1.0)

    async def _reload_config(self) -> bool:
        config = await groupconfig.load(self.client, self.keys, self.settings.group_id)
        if config is None:
            return False
        if self.config is None or config.version != self.config.version or config != self.config:
            self.apply_config(config)
        return True

    def apply_config(self, config: GroupConfig) -> None:
        """Swaps in a new configuration; in-flight calls are untouched, credit of kept pools is kept."""
        previous = {p.pool_id for p in self._policy.pools} if self._policy else set()
        self.config = config
        self._policy = config.scheduler_policy()
        for gone in previous - {p.pool_id for p in self._policy.pools}:
            self._state.forget(gone)
        self._config_changed.set()
        self._wake.set()
        log.info(
            "fabric group %s configuration version %s: %d pools, policy %s, total %d",
            config.group_id,
            config.version,
            len(self._policy.pools),
            config.policy,
            config.total_concurrency,
        )

    # --- scheduling -------------------------------------------------------------------------------
    async def _schedule_loop(self) -> None:
        backoff_min, backoff_max = self.settings.reconnect_backoff_s
        backoff = backoff_min
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                progressed = await self.schedule_round()
            except REDIS_ERRORS as exc:
                self._valkey_lost(exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), backoff)
                backoff = min(backoff * 2, backoff_max)
                continue
            self._valkey_back()
            backoff = backoff_min
            if not progressed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.settings.idle_poll_s)

    def _valkey_lost(self, exc: BaseException) -> None:
        if self.valkey_ok:
            self.stats.valkey_outages += 1
            log.warning(
                "dispatcher %s lost Valkey: %s; retrying with backoff", self.identity.dispatcher_id, exc
            )
        self.valkey_ok = False

    def _valkey_back(self) -> None:
        if not self.valkey_ok:
            log.info("dispatcher %s reconnected to Valkey", self.identity.dispatcher_id)
        self.valkey_ok = True

    async def schedule_round(self) -> bool:
        """One observe → decide → claim round; True if anything changed in the queues."""
        assert self._policy is not None and self.config is not None
        policy = self._policy
        pool_ids = [p.pool_id for p in policy.pools]
        depth = (
            max(self.settings.peek_depth, *(p.max_burst_per_visit for p in policy.pools)) if pool_ids else 1
        )
        views, self.group_in_flight = await self.queue.observe(pool_ids, depth)
        self.last_views = views
        now = time.time()
        drops: list[tuple[PeekedItem, str]] = []
        peeked: dict[str, list[PeekedItem]] = {}
        observations: dict[str, scheduler.PoolObservation] = {}
        for pool_id, view in views.items():
            heads = self._usable_heads(view, now, drops)
            peeked[pool_id] = heads
            observations[pool_id] = scheduler.PoolObservation(
                pool_id=pool_id,
                backlog=view.backlog,
                in_flight=view.in_flight,
                blocked=self.breakers.blocked(self.config.endpoint_for(pool_id)),
                heads=tuple(
                    scheduler.HeadItem(cost=i.cost, enqueued_at=i.envelope.enqueued_at)
                    for i in heads
                    if i.envelope
                ),
            )
        if drops:
            await self._drop(drops)
        free = self.settings.concurrency - len(self.running)
        decision = scheduler.decide(
            policy,
            self._state,
            observations,
            group_in_flight=self.group_in_flight,
            local_free_slots=max(0, free),
        )
        self._state = decision.state
        self.stats.skips.update(decision.skips)
        launched = await self._claim(policy, decision.launches, peeked)
        return bool(drops) or launched

    def _usable_heads(
        self, view: QueueView, now: float, drops: list[tuple[PeekedItem, str]]
    ) -> list[PeekedItem]:
        """Decoded heads up to the first unusable one; an unusable item at the very head is dropped."""
        heads: list[PeekedItem] = []
        for raw in view.heads:
            item = self._peek.get(raw)
            reason = DROP_MALFORMED if item.envelope is None else ""
            if (
                item.envelope is not None
                and item.envelope.deadline is not None
                and item.envelope.deadline <= now
            ):
                reason = DROP_EXPIRED
            if reason:
                if not heads:
                    drops.append((item, reason))
                break
            heads.append(item)
        return heads

    async def _drop(self, drops: list[tuple[PeekedItem, str]]) -> None:
        requests = [ClaimRequest(pool_id=self._pool_of(item), raw=item.raw, mode="drop") for item, _ in drops]
        results = await self.queue.claim(requests, self.settings.lease_s)
        now = time.time()
        for (item, reason), (code, _) in zip(drops, results, strict=True):
            self._peek.forget(item.raw)
            if code != "dropped":
                continue
            self.stats.dropped[reason] += 1
            if item.envelope is None:
                log.warning("dropped a malformed item from pool %s: %s", self._pool_of(item), item.error)
            else:
                record_span(
                    self.tracer,
                    item.envelope,
                    self.identity,
                    Outcome(
                        "dropped",
                        now,
                        now,
                        drop_reason=reason,
                        error_type=RequestExpired.error_type,
                        error_message="deadline passed before the request left its queue",
                    ),
                )

    def _pool_of(self, item: PeekedItem) -> str:
        if item.envelope is not None:
            return item.envelope.pool_id
        for pool_id, view in self.last_views.items():
            if item.raw in view.heads:
                return pool_id
        return ""

    async def _claim(
        self,
        policy: scheduler.GroupPolicy,
        launches: tuple[scheduler.Launch, ...],
        peeked: dict[str, list[PeekedItem]],
    ) -> bool:
        if not launches:
            return False
        caps = {p.pool_id: p.max_concurrent for p in policy.pools}
        chosen: list[tuple[scheduler.Launch, PeekedItem]] = []
        requests: list[ClaimRequest] = []
        for launch in launches:
            item = peeked[launch.pool_id][launch.index]
            assert item.envelope is not None
            chosen.append((launch, item))
            requests.append(
                ClaimRequest(
                    pool_id=launch.pool_id,
                    raw=item.raw,
                    mode="launch",
                    lease_member=lease_member(launch.pool_id, item.envelope.request_id),
                    producer_id=item.envelope.producer_id,
                    pool_max=caps[launch.pool_id],
                    group_limit=policy.total_concurrency,
                )
            )
        results = await self.queue.claim(requests, self.settings.lease_s)
        for (launch, item), request, (code, _) in zip(chosen, requests, results, strict=True):
            self._after_claim(launch, item, request, code)
        return True

    def _after_claim(
        self, launch: scheduler.Launch, item: PeekedItem, request: ClaimRequest, code: str
    ) -> None:
        envelope = item.envelope
        assert envelope is not None
        if code == "claimed":
            self._peek.forget(item.raw)
            self._start(envelope, launch.pool_id, request.lease_member, launch.cost)
            return
        scheduler.refund(self._state, launch)
        if code == "producer_gone":
            self._peek.forget(item.raw)
            self.stats.dropped[DROP_PRODUCER_GONE] += 1
            now = time.time()
            record_span(
                self.tracer,
                envelope,
                self.identity,
                Outcome("dropped", now, now, drop_reason=DROP_PRODUCER_GONE, cost=launch.cost),
            )
        elif code in (scheduler.SKIP_POOL_CAP, scheduler.SKIP_GROUP_CAP):
            self.stats.skips[(launch.pool_id, code)] += 1
        else:
            self._peek.forget(item.raw)
            self.stats.claim_lost += 1

    # --- execution --------------------------------------------------------------------------------
    def _start(self, envelope: Envelope, pool_id: str, member: str, cost: int) -> None:
        running = Running(envelope, pool_id, member, cost, time.time())
        self.running[envelope.request_id] = running
        self.stats.launched_by_pool[pool_id] += 1
        self.stats.cost_by_pool[pool_id] += cost
        task = asyncio.create_task(self._execute(running), name=f"call:{envelope.request_id}")
        self._tasks.add(task)
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a call task failed unexpectedly", exc_info=task.exception())

    async def _execute(self, run: Running) -> None:
        envelope = run.envelope
        assert self.config is not None
        endpoint = self.config.endpoint_for(run.pool_id)
        started = time.time()
        completion = None
        error: DispatchError | None = None
        try:
            completion = await self._call_backend(envelope, endpoint)
        except DispatchError as exc:
            error = exc
        except asyncio.CancelledError:
            error = Rejected("the dispatcher shut down before the call finished")
        except Exception as exc:  # a bug must still answer the producer and free the slot
            log.exception("unexpected error executing request %s", envelope.request_id)
            error = DispatchError(f"internal dispatcher error: {exc}")
        ended = time.time()
        timing = Timing(
            max(0.0, started - envelope.enqueued_at), ended - started, max(0.0, ended - envelope.enqueued_at)
        )
        if error is None and completion is not None:
            reply = Reply(envelope.request_id, STATUS_OK, completion=completion.body, timing=timing)
            self.stats.completed += 1
        else:
            assert error is not None
            reply = Reply(
                envelope.request_id,
                STATUS_ERROR,
                error_type=error.error_type,
                error_message=str(error),
                timing=timing,
            )
            self.stats.failed[error.error_type] += 1
        run.stage = "replying"
        delivered = await self._finish(run, reply.encode())
        self.running.pop(envelope.request_id, None)
        self._wake.set()
        usage = completion.usage if completion is not None else None
        record_span(
            self.tracer,
            envelope,
            self.identity,
            Outcome(
                STATUS_OK if error is None else STATUS_ERROR,
                started,
                ended,
                backend_url=redact_url(endpoint),
                error_type=error.error_type if error else "",
                error_message=str(error) if error else "",
                input_tokens=usage.input_tokens if usage else None,
                output_tokens=usage.output_tokens if usage else None,
                response_model=completion.model if completion else None,
                reply_delivered=delivered,
                cost=run.cost,
                drop_reason="" if delivered else DROP_REPLY_PRODUCER_GONE,
            ),
            content=content_attributes(envelope, completion.body if completion else None)
            if self.store_content
            else None,
        )

    async def _call_backend(self, envelope: Envelope, endpoint: str) -> Any:
        assert self.config is not None
        timeout = self.settings.backend_timeout_s
        if envelope.deadline is not None:
            timeout = min(timeout, envelope.deadline - time.time())
            if timeout <= 0:
                raise RequestExpired(f"request {envelope.request_id} expired before its call started")
        if not endpoint:
            raise Rejected(f"fabric group {self.config.group_id} has no endpoint for pool {envelope.pool_id}")
        api_key = self.secrets.get(self.config.api_key_env) if self.config.api_key_env else None
        backend = self.backends.get(endpoint, api_key)
        if not self.breakers.acquire(endpoint):
            raise BreakerOpen(f"the circuit breaker of {redact_url(endpoint)} is open")
        try:
            completion = await backend.complete(envelope.call.to_openai(), timeout_s=timeout)
        except DispatchError as exc:
            self.breakers.record(endpoint, exc)
            raise
        self.breakers.record(endpoint, None)
        return completion

    async def _finish(self, run: Running, reply: bytes) -> bool:
        """Delivers the reply (if the producer is alive) and releases the lease, retrying Valkey briefly."""
        delay = self.settings.reconnect_backoff_s[0]
        for attempt in range(5):
            try:
                delivered = await self.queue.finish(
                    pool_id=run.pool_id,
                    producer_id=run.envelope.producer_id,
                    member=run.member,
                    reply=reply,
                    reply_ttl_s=self.settings.reply_ttl_s,
                )
            except REDIS_ERRORS as exc:
                self._valkey_lost(exc)
                if attempt == 4:
                    self.stats.dropped[DROP_REPLY_UNDELIVERED] += 1
                    return False
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.reconnect_backoff_s[1])
                continue
            if not delivered:
                self.stats.dropped[DROP_REPLY_PRODUCER_GONE] += 1
            return delivered
        return False

    # --- background helpers -----------------------------------------------------------------------
    async def _pause(self, seconds: float) -> bool:
        """Sleeps up to ``seconds``; True once the dispatcher has finished and helpers should return."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._finished.wait(), seconds)
        return self._finished.is_set()

    async def _listen(self) -> None:
        """Wake-ups from producers and config-change notices; falls back to polling while broken."""
        while not self._finished.is_set():
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                await self._subscribe(pubsub)
                last_poll = time.monotonic()
                while not self._finished.is_set():
                    message = await pubsub.get_message(timeout=CONFIG_POLL_S)
                    if message is not None:
                        self._on_message(message)
                    if self._config_changed.is_set():
                        self._config_changed.clear()
                        await self._subscribe(pubsub)
                    if time.monotonic() - last_poll >= CONFIG_POLL_S:
                        last_poll = time.monotonic()
                        await self._reload_config()
            except REDIS_ERRORS as exc:
                self._valkey_lost(exc)
                self._subscribed = frozenset()
                await self._pause(self.settings.reconnect_backoff_s[0] * 5)
            finally:
                with contextlib.suppress(*REDIS_ERRORS):
                    await pubsub.aclose()

    async def _subscribe(self, pubsub: Any) -> None:
        assert self.config is not None
        wanted = frozenset(
            [self.keys.config_channel(self.settings.group_id)]
            + [self.keys.wake_channel(p.pool_id) for p in self.config.enabled_pools]
        )
        if wanted == self._subscribed:
            return
        if stale := self._subscribed - wanted:
            await pubsub.unsubscribe(*stale)
        if new := wanted - self._subscribed:
            await pubsub.subscribe(*new)
        self._subscribed = wanted

    def _on_message(self, message: Mapping[str, Any]) -> None:
        channel = message.get("channel", b"")
        channel = channel.decode() if isinstance(channel, bytes) else str(channel)
        if channel == self.keys.config_channel(self.settings.group_id):
            data = message.get("data")
            if data:
                with contextlib.suppress(DispatchError):
                    self.apply_config(GroupConfig.decode(data))
            return
        self._wake.set()

    async def _renew_leases(self) -> None:
        while not await self._pause(self.settings.lease_s / 3):
            leases = [(r.pool_id, r.member) for r in list(self.running.values())]
            try:
                await self.queue.renew(leases, self.settings.lease_s)
            except REDIS_ERRORS as exc:
                self._valkey_lost(exc)

    async def _publish_snapshots(self) -> None:
        while not await self._pause(self.settings.snapshot_interval_s):
            await self._publish_snapshot_once()

    def snapshot(self) -> dict[str, Any]:
        return build_snapshot(self, now=time.time())

    async def _publish_snapshot_once(self) -> None:
        if self.config is None:
            return
        snap = self.snapshot()
        deltas = self.stats.unflushed()
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.set(
                    self.keys.snapshot(self.settings.group_id, self.identity.dispatcher_id),
                    orjson.dumps(snap),
                    px=int(self.settings.snapshot_ttl_s * 1000),
                )
                for name, delta in deltas.items():
                    pipe.hincrby(self.keys.counters(self.settings.group_id), name, delta)
                await pipe.execute()
        except REDIS_ERRORS as exc:
            self.stats.restore(deltas)
            self._valkey_lost(exc)
        if self.snapshot_sink is not None and self._snapshot_changed(snap):
            try:
                await self.snapshot_sink(snap)
            except Exception as exc:  # the live feed must never stop dispatch
                log.warning("snapshot sink failed: %s", exc)

    def _snapshot_changed(self, snap: dict[str, Any]) -> bool:
        """Publish live events on change, and at least every few seconds as a heartbeat."""
        significant = {k: v for k, v in snap.items() if k not in ("at", "active")}
        significant["active"] = [(a["request_id"], a["stage"]) for a in snap["active"]]
        now = time.monotonic()
        if significant == self._last_published and now - self._last_published_at < HEARTBEAT_S:
            return False
        self._last_published, self._last_published_at = significant, now
        return True
