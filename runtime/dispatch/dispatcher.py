"""The dispatcher engine: one process of a fabric group, started by ``manage.py rundispatcher``.

Each scheduling round observes every pool of the group in one pipeline, decodes the peeked heads,
asks the pure scheduler (:func:`runtime.policy.scheduler.decide`) which heads may launch, and claims exactly
those with an atomic script (digest match, producer liveness, hard caps, in-flight lease). Each
claimed request runs in its own task and frees its slot the moment its own call ends. Nothing is
popped that cannot launch, so refused work stays visibly queued.

Failures are explicit and counted (see :mod:`runtime.dispatch.stats`): malformed items, producers gone before
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
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis
from opentelemetry import trace

from runtime.backends.adapter import BackendPool
from runtime.backends.fleet import BackendFleet
from runtime.backends.health import EndpointBreakers
from runtime.config import DispatcherSettings
from runtime.dispatch import scripts
from runtime.dispatch.execution import Executor, Running
from runtime.dispatch.listener import ChangeListener
from runtime.dispatch.peek import PeekCache, PeekedItem
from runtime.dispatch.queue import ClaimRequest, QueueOps, QueueView, TurnEnd, lease_member
from runtime.dispatch.snapshot import SnapshotPublisher, SnapshotSink, build_snapshot
from runtime.dispatch.stats import DROP_EXPIRED, DROP_MALFORMED, DROP_PRODUCER_GONE, DispatcherStats
from runtime.dispatch.wakeup import WakeWaiter
from runtime.errors import DispatchError, RequestExpired
from runtime.policy import scheduler
from runtime.telemetry.spans import Identity, Outcome, record_span
from runtime.valkey.client import REDIS_ERRORS
from runtime.wire import groupconfig
from runtime.wire.contract import Envelope
from runtime.wire.groupconfig import GroupConfig
from runtime.wire.keys import DEFAULT_KEYS, KeySpace

log = logging.getLogger(__name__)
CONFIG_POLL_S = 1.0
HELPER_EXIT_S = 5.0

__all__ = ["Dispatcher"]


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
        self.tracer = tracer or trace.get_tracer("llm_dispatch.dispatcher")
        self.identity = Identity(settings.group_id, settings.gateway_id, settings.dispatcher_id)
        self.stats = DispatcherStats()
        self.breakers = EndpointBreakers(settings.breaker)
        # Backend rows: load gate, shared breaker and the fleet's scraper (bare endpoint URLs keep
        # the per-process breakers above).
        self.fleet = BackendFleet(client, keys, owner_id=settings.dispatcher_id)
        self.executor = Executor(
            queue=self.queue, settings=settings, backends=self.backends, breakers=self.breakers,
            shared_breakers=self.fleet.breakers,
            stats=self.stats, tracer=self.tracer, identity=self.identity, secrets=dict(secrets or {}),
            store_content=store_content, on_valkey_error=self._valkey_lost,
        )  # fmt: skip
        self.publisher = SnapshotPublisher(
            client, keys, group_id=settings.group_id, dispatcher_id=settings.dispatcher_id,
            ttl_s=settings.snapshot_ttl_s, sink=snapshot_sink, on_error=self._valkey_lost,
        )  # fmt: skip
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
        self._waiting = False  # the scheduling loop waits for a reason to run a round
        self._slots = settings.concurrency  # local slots, within this dispatcher's share of the group
        self._idle = asyncio.Event()  # ... and has a free slot: the wake waiter may take a token
        self._stopping = asyncio.Event()
        self._finished = asyncio.Event()  # set once in-flight calls are done: helpers then exit
        self.listener = ChangeListener(
            client, channels=self._channels, on_message=self._on_message, poll=self._reload_config,
            on_error=self._valkey_lost, finished=self._finished, poll_s=CONFIG_POLL_S,
            retry_s=settings.reconnect_backoff_s[0] * 5,
        )  # fmt: skip
        self.waiter = WakeWaiter(
            client, keys=self._wake_lists, idle=self._idle, finished=self._finished, on_wake=self._woken,
            on_error=self._valkey_lost, retry_s=settings.reconnect_backoff_s[0] * 5,
        )  # fmt: skip

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
                    group.create_task(self.listener.run()),
                    group.create_task(self.waiter.run()),
                    group.create_task(self._renew_leases()),
                    group.create_task(self._publish_snapshots()),
                    group.create_task(self.fleet.scraper.run(self._finished, on_error=self._valkey_lost)),
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
            await self.publisher.withdraw(self.stats)

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
        self.fleet.configure(config.backends)
        for gone in previous - {p.pool_id for p in self._policy.pools}:
            self._state.forget(gone)
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
        poll = False
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                # The idle poll is shared by the fleet: one dispatcher's poll is enough for the group.
                if poll and not await self.queue.take_poll(self.settings.idle_poll_s):
                    progressed = False
                else:
                    progressed = await self.schedule_round()
            except REDIS_ERRORS as exc:
                self._valkey_lost(exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), backoff)
                backoff = min(backoff * 2, backoff_max)
                continue
            self._valkey_back()
            backoff = backoff_min
            poll = False
            if not progressed:
                poll = not await self._wait_for_work()

    async def _wait_for_work(self) -> bool:
        """Until woken (a token, a config change, stop: True) or the idle poll is due (False).

        Tokens are taken only while a slot is free, so they go to a dispatcher that can use them.
        """
        self._waiting = True
        if len(self.running) < self._slots:
            self._idle.set()
        try:
            await asyncio.wait_for(self._wake.wait(), self.settings.idle_poll_s)
            return True
        except TimeoutError:
            return False
        finally:
            self._waiting = False
            self._idle.clear()

    def _woken(self) -> None:
        self._idle.clear()  # one token per wait: the next is for another dispatcher
        self._wake.set()

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
        """One observe → decide → claim round; True if anything changed in the queues.

        The round runs only in the group's scheduling turn (:mod:`runtime.dispatch.turn`), taken in the
        observe pipeline and given back in the claim pipeline: the fleet decides as one scheduler.
        """
        assert self._policy is not None and self.config is not None
        policy = self._policy
        pool_ids = [p.pool_id for p in policy.pools]
        depth = (
            max(self.settings.peek_depth, *(p.max_burst_per_visit for p in policy.pools)) if pool_ids else 1
        )
        holder = self.identity.dispatcher_id if pool_ids else ""
        await self.fleet.refresh()
        views, self.group_in_flight = await self.queue.observe(
            pool_ids, depth, take_turn=holder, local_slots=self.settings.concurrency,
            backend_ids=sorted(self.fleet.backends),
        )  # fmt: skip
        self.last_views = views
        if holder and not self.queue.has_turn:
            self.stats.turn_busy += 1
            return False  # another dispatcher is deciding; the note we left makes it run once more
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
                blocked=self._blocked(pool_id),
                heads=tuple(
                    scheduler.HeadItem(cost=i.cost, enqueued_at=i.envelope.enqueued_at)
                    for i in heads[: self._allowance(pool_id) or None]
                    if i.envelope
                ),
            )
        if drops:
            await self._drop(drops)
        # Keep to our share of the group's slots, so the fleet splits the work evenly.
        own = self.settings.concurrency
        self._slots = scheduler.fleet_share(policy.total_concurrency, own, self.queue.fleet_slots or (own,))
        free = self._slots - len(self.running)
        protected = tuple(
            (p.pool_id, min(p.min_concurrent, p.max_concurrent))
            for p in policy.pools
            if p.min_concurrent > 0 and not p.paused and not observations[p.pool_id].blocked
        )
        decision = scheduler.decide(
            policy,
            self._state,
            observations,
            group_in_flight=self.group_in_flight,
            local_free_slots=max(0, free),
        )
        self._state = decision.state
        self.stats.skips.update(decision.skips)
        end_turn = None
        if holder:
            left = any(reason == scheduler.SKIP_LOCAL_CAPACITY for _, reason in decision.skips)
            end_turn = TurnEnd(holder=holder, left_work=left, wake_pool=pool_ids[0])
        claimed = await self._claim(policy, decision.launches, peeked, protected, end_turn)
        # Run again at once only if this round may have left launchable work behind (e.g. more
        # backlog than peeked). With the group full, FINISH tokens bring the next round; with our own
        # slots full, the turn's release woke another dispatcher. Rounds of our own beyond that would
        # take every freed slot for the finisher, and the work would not spread over the fleet.
        room = self.group_in_flight + claimed < policy.total_concurrency and free > claimed
        return bool(drops) or (claimed > 0 and room)

    def _backend_id(self, pool_id: str) -> str:
        backend = self.config.backend_for(pool_id) if self.config else None
        return backend.backend_id if backend else ""

    def _blocked(self, pool_id: str) -> str | None:
        """Why the pool's backend takes nothing now (breaker, saturation, cap); None when it may."""
        backend_id = self._backend_id(pool_id)
        if backend_id:
            return self.fleet.blocked(backend_id)
        assert self.config is not None
        return self.breakers.blocked(self.config.endpoint_for(pool_id))

    def _allowance(self, pool_id: str) -> int | None:
        """Most heads offered for the pool: nothing is claimed that its backend would refuse. (At 0 the
        pool is blocked, and its heads stay offered so the scheduler counts the reason it skips it.)"""
        backend_id = self._backend_id(pool_id)
        return self.fleet.allowance(backend_id) if backend_id else None

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
            if code != scripts.CLAIM_DROPPED:
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
        protected: tuple[tuple[str, int], ...],
        end_turn: TurnEnd | None,
    ) -> int:
        """Claims the launches; caps and the other pools' protected slots are checked in the claim.

        The same pipeline gives the scheduling turn back. Returns how many were claimed.
        """
        if not launches:
            if end_turn is not None:
                await self.queue.claim([], self.settings.lease_s, end_turn=end_turn)
            return 0
        caps = {p.pool_id: p.max_concurrent for p in policy.pools}
        own = dict(protected)
        chosen: list[tuple[scheduler.Launch, PeekedItem]] = []
        requests: list[ClaimRequest] = []
        for launch in launches:
            item = peeked[launch.pool_id][launch.index]
            assert item.envelope is not None
            chosen.append((launch, item))
            backend_id = self._backend_id(launch.pool_id)
            requests.append(
                ClaimRequest(
                    pool_id=launch.pool_id,
                    raw=item.raw,
                    mode="launch",
                    lease_member=lease_member(launch.pool_id, item.envelope.request_id),
                    producer_id=item.envelope.producer_id,
                    pool_max=caps[launch.pool_id],
                    group_limit=policy.total_concurrency,
                    protected=own.get(launch.pool_id, 0),
                    reserved_for=tuple(p for p in protected if p[0] != launch.pool_id),
                    backend_id=backend_id,
                    backend_limit=self.fleet.limit(backend_id) if backend_id else None,
                )
            )
        results = await self.queue.claim(requests, self.settings.lease_s, end_turn=end_turn)
        for (launch, item), request, (code, _) in zip(chosen, requests, results, strict=True):
            self._after_claim(launch, item, request, code)
        return sum(code == scripts.CLAIMED for code, _ in results)

    def _after_claim(
        self, launch: scheduler.Launch, item: PeekedItem, request: ClaimRequest, code: str
    ) -> None:
        envelope = item.envelope
        assert envelope is not None
        if code == scripts.CLAIMED:
            self._peek.forget(item.raw)
            self._start(envelope, launch.pool_id, request.lease_member, launch.cost)
            return
        scheduler.refund(self._state, launch)
        if code == scripts.CLAIM_PRODUCER_GONE:
            self._peek.forget(item.raw)
            self.stats.dropped[DROP_PRODUCER_GONE] += 1
            now = time.time()
            record_span(
                self.tracer,
                envelope,
                self.identity,
                Outcome("dropped", now, now, drop_reason=DROP_PRODUCER_GONE, cost=launch.cost),
            )
        elif code in (scripts.CLAIM_POOL_CAP, scripts.CLAIM_GROUP_CAP, scripts.CLAIM_RESERVED):
            self.stats.skips[(launch.pool_id, code)] += 1
        elif code == scripts.CLAIM_BACKEND_CAP:
            self.stats.skips[(launch.pool_id, self.fleet.skip_reason(request.backend_id))] += 1
        else:
            self._peek.forget(item.raw)
            self.stats.claim_lost += 1

    # --- execution --------------------------------------------------------------------------------
    def _start(self, envelope: Envelope, pool_id: str, member: str, cost: int) -> None:
        running = Running(envelope, pool_id, member, cost, time.time(), backend_id=self._backend_id(pool_id))
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
        assert self.config is not None
        try:
            await self.executor.execute(run, self.config)
        finally:
            self.running.pop(run.envelope.request_id, None)
            # No round of our own: FINISH pushed a wake token, which goes to the dispatcher of the
            # group that has waited longest (maybe this one), so freed slots spread over the fleet.
            if self._waiting and len(self.running) < self._slots:
                self._idle.set()

    # --- background helpers -----------------------------------------------------------------------
    async def _pause(self, seconds: float) -> bool:
        """Sleeps up to ``seconds``; True once the dispatcher has finished and helpers should return."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._finished.wait(), seconds)
        return self._finished.is_set()

    def _channels(self) -> frozenset[str]:
        """The config channel and the group's cancel channel (wake-ups travel as tokens, not messages)."""
        group_id = self.settings.group_id
        return frozenset([self.keys.config_channel(group_id), self.keys.cancel_channel(group_id)])

    def _wake_lists(self) -> list[str]:
        """The wake-up token list of every enabled pool of the group."""
        return [self.keys.wake_list(p.pool_id) for p in self.config.enabled_pools] if self.config else []

    def _on_message(self, channel: str, data: bytes) -> None:
        if channel == self.keys.config_channel(self.settings.group_id):
            if data:
                with contextlib.suppress(DispatchError):
                    self.apply_config(GroupConfig.decode(data))
            return
        if channel == self.keys.cancel_channel(self.settings.group_id):
            self.executor.cancel(data.decode())

    async def _renew_leases(self) -> None:
        while not await self._pause(self.settings.lease_s / 3):
            leases = [(r.pool_id, r.member, r.backend_id) for r in list(self.running.values())]
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
        if self.config is not None:
            await self.publisher.publish(self.snapshot(), self.stats)
