"""The dispatcher engine: one process of a fabric group, started by ``manage.py rundispatcher``.

Each scheduling round observes every pool of the group in one pipeline (reading heads only of pools
that could launch: :mod:`runtime.policy.reads`), decodes the peeked heads, asks the pure scheduler
(:func:`runtime.policy.scheduler.decide`) which heads may launch, and claims exactly those with an
atomic script (digest match, duplicates, producer liveness, hard caps, in-flight lease and its
record). Each claimed request runs in its own task and frees its slot the moment its own call ends.
Nothing is popped that cannot launch (a half-open breaker is offered only its probe slots), so
refused work stays visibly queued.

A fleet of dispatchers in one group behaves as one: a round runs only in the group's scheduling turn
(:mod:`runtime.queue.turn`, taken in the observe pipeline and given back in the claim pipeline),
each dispatcher keeps to its share of the group's slots, the claim checks the protected slots owed
to the group's other pools, and idle dispatchers wait for wake tokens (:mod:`runtime.dispatch.wakeup`).

Failures are explicit and counted (see :mod:`runtime.dispatch.stats`): malformed items, producers
gone before execution or before the reply, expired deadlines, duplicates, calls lost with a dead
dispatcher, backend errors by type, refused configurations. No exception ends the process: a round
that fails is logged and counted as ``internal_error`` (a claimed request it could not start gets an
error reply). Valkey outages are survived with jittered exponential backoff; SIGTERM/SIGINT stop
taking work, let in-flight calls finish within the grace period, reply, and return.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import time
from collections.abc import Mapping

import redis.asyncio as aioredis
from opentelemetry import trace

from runtime.backends.adapter import BackendPool
from runtime.backends.breaker import BLOCKED_REASON
from runtime.backends.fleet import BackendFleet
from runtime.backends.gate import SKIP_BACKEND_CAP, SKIP_BACKEND_SATURATED
from runtime.backends.health import EndpointBreakers
from runtime.backoff import Backoff
from runtime.config import DispatcherSettings
from runtime.dispatch import redelivery
from runtime.dispatch.drops import DropRecorder
from runtime.dispatch.execution import Executor, Running
from runtime.dispatch.listener import ChangeListener
from runtime.dispatch.peek import PeekCache, PeekedItem, usable_heads
from runtime.dispatch.snapshot import DispatcherSnapshot, SnapshotSink, SnapshotStore, build_snapshot
from runtime.dispatch.stats import (
    DROP_DUPLICATE,
    DROP_PRODUCER_GONE,
    DispatcherStats,
)
from runtime.dispatch.wakeup import WakeWaiter
from runtime.errors import DispatchError
from runtime.policy import scheduler
from runtime.policy.reads import plan_reads, unread_skip
from runtime.queue import scripts
from runtime.queue.dispatching import ClaimRequest, QueueOps, QueueView, TurnEnd, lease_member
from runtime.queue.keys import DEFAULT_KEYS, KeySpace
from runtime.queue.leases import LeaseRecord
from runtime.telemetry.spans import Identity
from runtime.valkey.client import REDIS_ERRORS
from runtime.wire.contract import Envelope
from runtime.wire.groupconfig import GroupConfig

log = logging.getLogger(__name__)
# The refusals that come from a pool's backend: the scheduler sees the pool blocked for that reason.
BACKEND_REFUSALS = frozenset({BLOCKED_REASON, SKIP_BACKEND_SATURATED, SKIP_BACKEND_CAP})
CONFIG_POLL_S = 1.0
HELPER_EXIT_S = 5.0
# Due retries are moved back into their lists this often: a retry waits its backoff, plus at most this.
RETRY_POLL_S = 0.05
# Screening's reason for a durable request put back by expired leases more often than its pool allows.
DEAD_LETTER = "dead_letter"
# Claim outcomes that take the item off its queue without running it, and the drop reason of each.
CLAIM_DROPS = {scripts.CLAIM_PRODUCER_GONE: DROP_PRODUCER_GONE, scripts.CLAIM_DUPLICATE: DROP_DUPLICATE}
LEFT_THE_QUEUE = frozenset({scripts.CLAIMED, *CLAIM_DROPS})
Drop = tuple[str, PeekedItem, str]  # (the pool whose list holds it, the item, the drop reason)

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
            timeout_s=settings.backend_timeout_s,
            connect_timeout_s=settings.backend_connect_timeout_s,
            # One connection per slot: with fewer, long calls past the pool's size wait for a connection.
            max_connections=settings.concurrency,
        )
        self.tracer = tracer or trace.get_tracer("llm_dispatch.dispatcher")
        self.identity = Identity(settings.group_id, settings.gateway_id, settings.dispatcher_id)
        self.stats = DispatcherStats()
        self.drops = DropRecorder(self.stats, self.tracer, self.identity)
        self.redeliveries = redelivery.Redeliveries(
            self.queue, self.stats, self.tracer, self.identity, reply_ttl_s=settings.reply_ttl_s
        )
        self.breakers = EndpointBreakers(settings.breaker)
        # Backend rows: load gate, shared breaker and the fleet's scraper; bare endpoint URLs keep
        # the per-process breakers above. Every breaker question goes through it.
        self.fleet = BackendFleet(client, keys, owner_id=settings.dispatcher_id, local=self.breakers)
        self.executor = Executor(
            queue=self.queue, settings=settings, backends=self.backends, breakers=self.fleet,
            stats=self.stats, tracer=self.tracer, identity=self.identity, secrets=dict(secrets or {}),
            store_content=store_content, on_valkey_error=self._valkey_lost,
        )  # fmt: skip
        self.publisher = SnapshotStore(
            client, keys, group_id=settings.group_id, dispatcher_id=settings.dispatcher_id,
            ttl_s=settings.snapshot_ttl_s, sink=snapshot_sink, on_error=self._valkey_lost,
        )  # fmt: skip
        self.config: GroupConfig | None = None
        self.started_at = time.time()
        self.valkey_ok = True
        self.last_views: dict[str, QueueView] = {}
        self.group_in_flight = 0
        self.running: dict[str, Running] = {}  # by lease member
        self._heads_seen: dict[str, tuple[bytes, ...]] = {}
        self._rejected_config: bytes | str | None = None
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
            backoff_s=settings.reconnect_backoff_s,
        )  # fmt: skip
        self.waiter = WakeWaiter(
            client, keys=self._wake_lists, idle=self._idle, finished=self._finished, on_wake=self._woken,
            on_error=self._valkey_lost, backoff_s=settings.reconnect_backoff_s,
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
        """The decoded head of a pool as last read (served from the peek cache)."""
        heads = self._heads_seen.get(pool_id)
        return self._peek.get(heads[0]) if heads else None

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
                    group.create_task(self._promote_retries()),
                    group.create_task(
                        self.fleet.scraper.run(
                            self._finished, on_error=self._valkey_lost, on_crash=self._internal_error
                        )
                    ),
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
        """Applies the published configuration if it changed; True once a configuration is in force."""
        raw = await self.client.get(self.keys.group_config(self.settings.group_id))
        if raw:
            self._consider_config(raw)
        return self.config is not None

    def _consider_config(self, raw: bytes | str) -> None:
        """Applies a published configuration, or refuses it visibly (logged, counted, in the snapshot)."""
        try:
            config = GroupConfig.decode(raw)
            if self.config is None or config.version != self.config.version or config != self.config:
                if problems := scheduler.validate_policy(config.scheduler_policy()):
                    raise ValueError("; ".join(problems))
                self.apply_config(config)
        except (DispatchError, ValueError, TypeError) as exc:
            if raw != self._rejected_config:  # polled again and again: count each refused value once
                self._rejected_config = raw
                self.stats.config_rejected += 1
                log.error(
                    "dispatcher %s refused a configuration of fabric group %s and keeps version %s: %s",
                    self.identity.dispatcher_id,
                    self.settings.group_id,
                    self.config.version if self.config else None,
                    exc,
                )

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
        backoff = Backoff(*self.settings.reconnect_backoff_s)
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
            except Exception:  # one bad item or one bug must not end dispatch for the whole group
                self._internal_error("a scheduling round failed")
            else:
                self._valkey_back()
                backoff.reset()
                poll = False
                if not progressed:
                    poll = not await self._wait_for_work()
                continue
            poll = False  # a failed round is retried after the backoff, not left to the fleet's poll
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), backoff.next())

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

    def _internal_error(self, what: str) -> None:
        """Logs the exception being handled and counts it; the caller carries on."""
        self.stats.internal_errors += 1
        log.exception("dispatcher %s: %s", self.identity.dispatcher_id, what)

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
        """One observe → decide → claim round; True if the round left work a round of its own should take.

        That is: a request left a queue without running (dropped), or requests were claimed and this
        round may have left launchable work behind. The round runs only in the group's scheduling
        turn; every path that took the turn gives it back in a claim pipeline (a round that fails
        midway leaves it to lapse after :data:`runtime.queue.turn.TURN_LEASE_MS`).
        """
        assert self._policy is not None and self.config is not None
        self.stats.rounds += 1
        policy = self._policy
        planned_free = max(0, self._slots - len(self.running))
        await self.fleet.refresh()
        plan = plan_reads(
            policy,
            peek_depth=self.settings.peek_depth,
            local_free=planned_free,
            allowances={p.pool_id: self._room(p.pool_id) for p in policy.pools},
            heads_cached=frozenset(pool_id for pool_id, heads in self._heads_seen.items() if heads),
        )
        # A pool whose backend has no room is refused for the backend's own reason (breaker open,
        # saturated, at its max in flight).
        refusals = {
            pool_id: (self._refusal(pool_id) or reason) if reason == BLOCKED_REASON else reason
            for pool_id, reason in plan.refusals.items()
        }
        holder = self.identity.dispatcher_id if policy.pools else ""
        seen = await self.queue.observe(
            plan.reads, policy.total_concurrency, take_turn=holder, local_slots=self.settings.concurrency,
            backend_ids=sorted(self.fleet.backends),
        )  # fmt: skip
        self.group_in_flight, self.last_views = seen.group_in_flight, seen.views
        if seen.lost:  # reaped by this observe, whether or not the turn is ours: counted here or nowhere
            await self._lost(seen.lost)
        if seen.requeued:  # likewise for durable requests the reap put back
            self.redeliveries.requeued(seen.requeued)
        for pool_id, view in seen.views.items():
            self._remember_heads(pool_id, view)
        if holder and not self.queue.has_turn:
            self.stats.turn_busy += 1
            return False  # another dispatcher is deciding; the note we left makes it run once more
        observations, peeked, drops = self._screen(policy, seen.views, refusals, time.time())
        dropped = await self._drop(drops) if drops else False
        # Keep to our share of the group's slots, so the fleet splits the work evenly.
        own = self.settings.concurrency
        self._slots = scheduler.fleet_share(policy.total_concurrency, own, self.queue.fleet_slots or (own,))
        # Heads were read only if the plan saw a free slot: with none then, nothing launches now.
        local_free = min(planned_free, max(0, self._slots - len(self.running)))
        group_room = self.group_in_flight < policy.total_concurrency
        end_turn = None
        if holder:
            # Work left because our own slots are full: the turn's release wakes another dispatcher.
            cut = local_free == 0 and any(v.backlog > 0 for v in seen.views.values())
            end_turn = TurnEnd(holder=holder, left_work=group_room and cut, wake_pool=policy.pools[0].pool_id)
        if local_free == 0 or not group_room:
            # Nothing can launch, and no heads were read: a DRR walk over head-less pools would
            # only advance its round and hand out quanta nobody earned.
            if end_turn is not None:
                await self.queue.claim([], self.settings.lease_s, end_turn=end_turn)
            return dropped
        decision = scheduler.decide(
            policy,
            self._state,
            observations,
            group_in_flight=self.group_in_flight,
            local_free_slots=local_free,
        )
        self._state = decision.state
        self.stats.skips.update(decision.skips)
        if end_turn is not None and any(r == scheduler.SKIP_LOCAL_CAPACITY for _, r in decision.skips):
            end_turn = dataclasses.replace(end_turn, left_work=True)
        protected = tuple(
            (p.pool_id, min(p.min_concurrent, p.max_concurrent))
            for p in policy.pools
            if p.min_concurrent > 0 and not p.paused and not observations[p.pool_id].blocked
        )
        claimed, claim_dropped = await self._claim(policy, decision.launches, peeked, protected, end_turn)
        # Run again at once only if this round may have left launchable work behind (e.g. more
        # backlog than peeked). With the group full, FINISH tokens bring the next round; with our own
        # slots full, the turn's release woke another dispatcher. Rounds of our own beyond that would
        # take every freed slot for the finisher, and the work would not spread over the fleet.
        room = self.group_in_flight + claimed < policy.total_concurrency and local_free > claimed
        return dropped or claim_dropped or (claimed > 0 and room and self._backlog_may_remain(seen.views))

    async def _lost(self, records: tuple[LeaseRecord, ...]) -> None:
        """Expired leases nobody requeued: calls lost in flight, and durable streams interrupted after
        their first chunk (answered ``stream_interrupted``)."""
        self.drops.lost(r for r in records if not r.streamed)
        streamed = [r for r in records if r.streamed]
        if streamed:
            await self.redeliveries.interrupted(streamed, self.executor.relay.answer)

    def _backlog_may_remain(self, views: dict[str, QueueView]) -> bool:
        """False when every pool's list was empty as of this round: its observation, or, for a pool
        claimed from, the claim's own count right after the pop. A push after either makes a list
        non-empty and so brings a wake token: a round now would only find nothing (issue 13)."""
        assert self._policy is not None
        left = self.queue.backlog_after_claim
        for pool in self._policy.pools:
            view = views.get(pool.pool_id)
            if view is None or left.get(pool.pool_id, view.backlog) > 0:
                return True
        return False

    def _backend_id(self, pool_id: str) -> str:
        return self.config.route(pool_id).backend_id if self.config else ""

    def _refusal(self, pool_id: str) -> str | None:
        """Why the pool's backend takes nothing now (breaker, saturation, cap); None when it may."""
        assert self.config is not None
        route = self.config.route(pool_id)
        return self.fleet.refusal(route.backend_id, route.endpoint)

    def _room(self, pool_id: str) -> int | None:
        """Most heads offered for the pool: nothing is claimed that its backend would refuse."""
        assert self.config is not None
        route = self.config.route(pool_id)
        return self.fleet.room(route.backend_id, route.endpoint)

    def _screen(
        self,
        policy: scheduler.GroupPolicy,
        views: Mapping[str, QueueView],
        refusals: Mapping[str, str],
        now: float,
    ) -> tuple[dict[str, scheduler.PoolObservation], dict[str, list[PeekedItem]], list[Drop]]:
        """What the scheduler sees of each pool, its usable heads, and the unusable heads to drop.

        The list an item sits in is authoritative: an item whose ``pool_id`` names another pool
        (moved between lanes by an operator) is served, or dropped, in the list it was read from.
        """
        observations: dict[str, scheduler.PoolObservation] = {}
        peeked: dict[str, list[PeekedItem]] = {}
        drops: list[Drop] = []
        for pool in policy.pools:
            pool_id, view = pool.pool_id, views[pool.pool_id]
            refusal = refusals.get(pool_id)
            if not view.heads_read and view.backlog > 0:
                self.stats.skips[(pool_id, unread_skip(pool, view.in_flight, refusal))] += 1
            heads, unusable = usable_heads(self._peek, view.heads, now)
            if unusable is not None:
                drops.append((pool_id, *unusable))
            heads = self._below_requeue_limit(pool_id, heads, drops)
            peeked[pool_id] = heads
            observations[pool_id] = scheduler.PoolObservation(
                pool_id=pool_id,
                backlog=view.backlog,
                in_flight=view.in_flight,
                blocked=refusal if refusal in BACKEND_REFUSALS else None,
                heads=tuple(i.head for i in heads if i.head is not None),
            )
        return observations, peeked, drops

    def _below_requeue_limit(
        self, pool_id: str, heads: list[PeekedItem], drops: list[Drop]
    ) -> list[PeekedItem]:
        """Heads up to the first durable request requeued too often; that one, at the very head, is buried."""
        for i, item in enumerate(heads):
            if item.envelope is not None and self.redeliveries.exhausted(self.config, item.envelope):
                if i == 0:
                    drops.append((pool_id, item, DEAD_LETTER))
                return heads[:i]
        return heads

    def _remember_heads(self, pool_id: str, view: QueueView) -> None:
        """Heads last read per pool, for the snapshot's oldest-pending age while a pool sits at its cap."""
        if view.heads_read or view.backlog == 0:
            self._heads_seen[pool_id] = view.heads
        elif view.display_head is not None:
            self._heads_seen[pool_id] = (view.display_head,)

    async def _drop(self, drops: list[Drop]) -> bool:
        """Removes unusable heads from the lists they were read from; True if any was removed."""
        removed = False
        for pool_id, item, _ in (d for d in drops if d[2] == DEAD_LETTER):
            self._peek.forget(item.raw)
            assert item.envelope is not None
            removed = await self.redeliveries.bury(pool_id, item.raw, item.envelope) or removed
        drops = [d for d in drops if d[2] != DEAD_LETTER]
        requests = [ClaimRequest(pool_id=pool_id, raw=item.raw, mode="drop") for pool_id, item, _ in drops]
        results = await self.queue.claim(requests, self.settings.lease_s) if requests else []
        for (pool_id, item, reason), (code, _, _) in zip(drops, results, strict=True):
            self._peek.forget(item.raw)
            if code != scripts.CLAIM_DROPPED:
                continue
            removed = True
            if item.envelope is None:
                self.drops.malformed(pool_id, item.error)
            else:
                self.drops.dropped(item.envelope, reason)
        return removed

    async def _claim(
        self,
        policy: scheduler.GroupPolicy,
        launches: tuple[scheduler.Launch, ...],
        peeked: dict[str, list[PeekedItem]],
        protected: tuple[tuple[str, int], ...],
        end_turn: TurnEnd | None,
    ) -> tuple[int, bool]:
        """Claims the decided launches; caps and the other pools' protected slots are checked in the
        claim, and the same pipeline gives the scheduling turn back.

        Returns how many were claimed, and whether the claim dropped any (duplicate, producer gone).
        """
        assert self.config is not None
        if self._stopping.is_set():  # a stop requested during this round takes no more work
            launches = ()
        caps = {p.pool_id: p.max_concurrent for p in policy.pools} if launches else {}
        own = dict(protected)
        chosen: list[tuple[scheduler.Launch, PeekedItem, ClaimRequest, str]] = []  # ..., endpoint
        claimed_at = time.time()
        for launch in launches:
            item = peeked[launch.pool_id][launch.index]
            envelope = item.envelope
            assert envelope is not None
            route = self.config.route(launch.pool_id)
            backend_id, endpoint = route.backend_id, route.endpoint
            allowed = self.fleet.acquire_now(backend_id, endpoint)
            if allowed is None:
                allowed = await self.fleet.acquire(backend_id, endpoint)
            if not allowed:
                scheduler.refund(self._state, launch)
                self.stats.skips[(launch.pool_id, BLOCKED_REASON)] += 1
                continue
            request = ClaimRequest(
                pool_id=launch.pool_id,
                raw=item.raw,
                mode="launch",
                lease_member=lease_member(launch.pool_id, envelope.request_id),
                producer_id=envelope.producer_id,
                pool_max=caps[launch.pool_id],
                group_limit=policy.total_concurrency,
                lease_record=LeaseRecord.encode_of(
                    envelope,
                    pool_id=launch.pool_id,
                    claimed_at=claimed_at,
                    dispatcher_id=self.identity.dispatcher_id,
                    cost=launch.cost,
                ),
                protected=own.get(launch.pool_id, 0),
                reserved_for=tuple(p for p in protected if p[0] != launch.pool_id) if protected else (),
                requeue=redelivery.requeued(envelope).encode() if self.config.durable else b"",
                backend_id=backend_id,
                backend_limit=self.fleet.limit(backend_id) if backend_id else None,
            )
            chosen.append((launch, item, request, endpoint))
        if not chosen and end_turn is None:
            return 0, False
        try:
            results = await self.queue.claim(
                [request for _, _, request, _ in chosen], self.settings.lease_s, end_turn=end_turn
            )
        except BaseException:
            for _, _, request, endpoint in chosen:
                await self.fleet.release(request.backend_id, endpoint)
            raise
        claimed, dropped = 0, False
        for (launch, item, request, endpoint), (code, _, token) in zip(chosen, results, strict=True):
            claimed += code == scripts.CLAIMED
            dropped = dropped or code in CLAIM_DROPS
            if code != scripts.CLAIMED:  # the call will not happen: its breaker slot goes back
                await self.fleet.release(request.backend_id, endpoint)
            try:
                self._after_claim(launch, item, request, code, token)
            except Exception:  # the other claimed requests of this round still start
                self._internal_error(f"handling the claim of an item of pool {launch.pool_id} failed")
                if code == scripts.CLAIMED and request.lease_member not in self.running:
                    assert item.envelope is not None
                    refused = DispatchError("internal dispatcher error before the call started")
                    self._start(item.envelope, launch.pool_id, request.lease_member, launch.cost, refused)
        return claimed, dropped

    def _after_claim(
        self, launch: scheduler.Launch, item: PeekedItem, request: ClaimRequest, code: str, token: str = ""
    ) -> None:
        envelope = item.envelope
        assert envelope is not None and self.config is not None
        if code == scripts.CLAIMED:
            self._peek.forget(item.raw)
            self._start(envelope, launch.pool_id, request.lease_member, launch.cost, token=token)
            return
        scheduler.refund(self._state, launch)
        if code in CLAIM_DROPS:
            self._peek.forget(item.raw)
            self.drops.dropped(envelope, CLAIM_DROPS[code], cost=launch.cost)
        elif code in (scripts.CLAIM_POOL_CAP, scripts.CLAIM_GROUP_CAP, scripts.CLAIM_RESERVED):
            self.stats.skips[(launch.pool_id, code)] += 1
        elif code == scripts.CLAIM_BACKEND_CAP:
            self.stats.skips[(launch.pool_id, self.fleet.skip_reason(request.backend_id))] += 1
        else:
            self._peek.forget(item.raw)
            self.stats.claim_lost += 1

    # --- execution --------------------------------------------------------------------------------
    def _start(
        self,
        envelope: Envelope,
        pool_id: str,
        member: str,
        cost: int,
        refused: DispatchError | None = None,
        *,
        token: str = "",
    ) -> None:
        """Runs a claimed request in its own task (or, with ``refused``, answers it with that error)."""
        running = Running(
            envelope, pool_id, member, cost, time.time(), token=token, backend_id=self._backend_id(pool_id)
        )
        self.running[member] = running
        self.stats.launched_by_pool[pool_id] += 1
        self.stats.cost_by_pool[pool_id] += cost
        task = asyncio.create_task(self._execute(running, refused), name=f"call:{envelope.request_id}")
        self._tasks.add(task)
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a call task failed unexpectedly", exc_info=task.exception())

    async def _execute(self, run: Running, refused: DispatchError | None) -> None:
        assert self.config is not None
        try:
            await self.executor.execute(run, self.config, refused)
        finally:
            self.running.pop(run.member, None)
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
                self._consider_config(data)
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

    async def _promote_retries(self) -> None:
        """Moves due retries back into their pools' lists (nothing to do in a group without retries)."""
        while not await self._pause(RETRY_POLL_S):
            try:
                if await self.redeliveries.promote(self.config):
                    self._wake.set()
            except REDIS_ERRORS as exc:
                self._valkey_lost(exc)

    async def _publish_snapshots(self) -> None:
        while not await self._pause(self.settings.snapshot_interval_s):
            await self._publish_snapshot_once()

    def snapshot(self) -> DispatcherSnapshot:
        return build_snapshot(self, now=time.time())

    async def _publish_snapshot_once(self) -> None:
        if self.config is not None:
            await self.publisher.publish(self.snapshot(), self.stats)
