"""The dispatcher engine: one process of a fabric group, started by ``manage.py rundispatcher``.

Each scheduling round (:mod:`runtime.dispatch.rounds`) decodes the heads its last observation peeked
(reading heads only of pools that could launch: :mod:`runtime.policy.reads`), asks the pure scheduler
(:func:`runtime.policy.scheduler.decide`) which heads may launch, and claims exactly those with an
atomic script (digest match, duplicates, producer liveness, hard caps, in-flight lease and its
record), the next observation read in the same round trip. Each claimed request runs in its own task
and frees its slot the moment its own call ends. Nothing is popped that cannot launch (a half-open breaker is
offered only its probe slots), so refused work stays visibly queued.

A fleet of dispatchers in one group behaves as one: a round runs only in the group's scheduling turn
(:mod:`runtime.queue.turn`, taken by the observation a decision is made from and given back by the
first that allows none),
each dispatcher keeps to its share of the group's slots, the claim checks the protected slots owed
to the group's other pools, and idle dispatchers wait for wake tokens (:mod:`runtime.dispatch.wakeup`).
At low concurrency an idle dispatcher also leaves a standing claim ticket, and a push claims its request
for that dispatcher's inbox: the call starts without a round (:mod:`runtime.dispatch.tickets`,
:mod:`runtime.dispatch.ticketing`).

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
import logging
import signal
import time
from collections.abc import Mapping

import redis.asyncio as aioredis
from opentelemetry import trace

from runtime.backends.adapter import BackendPool
from runtime.backends.fleet import BackendFleet
from runtime.backends.health import EndpointBreakers
from runtime.backoff import Backoff
from runtime.config import DispatcherSettings
from runtime.dispatch import redelivery
from runtime.dispatch.configuring import Configuring
from runtime.dispatch.drops import DropRecorder
from runtime.dispatch.execution import Executor
from runtime.dispatch.listener import ChangeListener
from runtime.dispatch.peek import PeekCache, PeekedItem
from runtime.dispatch.rounds import Rounds
from runtime.dispatch.running import Running, RunningCalls
from runtime.dispatch.snapshot import DispatcherSnapshot, SnapshotSink, SnapshotStore, build_snapshot
from runtime.dispatch.stats import DispatcherStats
from runtime.dispatch.ticketing import Ticketing
from runtime.dispatch.tickets import Tickets
from runtime.dispatch.upkeep import Upkeep
from runtime.dispatch.wakeup import WakeLists, WakeWaiter
from runtime.errors import DispatchError
from runtime.policy import scheduler
from runtime.queue.dispatching import QueueOps, QueueView
from runtime.queue.keys import DEFAULT_KEYS, KeySpace
from runtime.telemetry.spans import Identity
from runtime.valkey.client import REDIS_ERRORS, failing_over
from runtime.wire.contract import Envelope
from runtime.wire.groupconfig import GroupConfig

log = logging.getLogger(__name__)
CONFIG_POLL_S = 1.0
HELPER_EXIT_S = 5.0

__all__ = ["Dispatcher"]


class Dispatcher(Rounds, Configuring, Upkeep, Ticketing):
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
        self.queue.riding = self.fleet  # its readings ride in the rounds' pipelines
        self.executor = Executor(
            queue=self.queue, settings=settings, backends=self.backends, breakers=self.fleet,
            stats=self.stats, tracer=self.tracer, identity=self.identity, secrets=dict(secrets or {}),
            store_content=store_content, on_valkey_error=self._valkey_lost,
            on_finish_retrying=self._finish_retrying,
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
        self.running = RunningCalls()  # by lease member
        self.finishing: dict[str, Running] = {}  # done, FINISH waiting for Valkey: no slot, lease renewed
        self._heads_seen: dict[str, tuple[bytes, ...]] = {}
        self._deeper: dict[str, int] = {}
        self._head_token: tuple[str, bytes] | None = None  # the last wake token's request, by pool
        self._wake_lists_of = WakeLists(keys)
        self.tickets = Tickets(keys, settings.dispatcher_id, settings.group_id, settings.lease_s)
        self._reading = None
        self._waited: tuple[GroupConfig | None, tuple[str, ...]] = (None, ())  # BLPOP's keys, by config
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
            client, keys=self._wake_lists, prelude=self._ticket_commands, answered=self._ticket_answers,
            unsent=self._ticket_commands_unsent, idle=self._idle, finished=self._finished,
            on_wake=self._woken, on_error=self._valkey_lost,
            backoff_s=settings.reconnect_backoff_s,
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
                await self._withdraw_tickets()
                await self._drain()
                # Helpers leave their loops on their own: cancelling redis-py mid-command can hang.
                self._finished.set()
                _, stuck = await asyncio.wait(helpers, timeout=HELPER_EXIT_S)
                for task in stuck:
                    task.cancel()
            await self._withdraw_tickets()  # what arrived while calls drained (the waiter no longer takes)
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

    # --- scheduling -------------------------------------------------------------------------------
    async def _schedule_loop(self) -> None:
        backoff = Backoff(*self.settings.reconnect_backoff_s)
        poll = False
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                if len(self.running) >= self.settings.concurrency:
                    # No free slot: a round could launch nothing, and the slot freed next wakes us.
                    progressed = False
                # The idle poll is shared by the fleet: one dispatcher's poll is enough for the group.
                elif poll and not await self.queue.take_poll(self.settings.idle_poll_s):
                    progressed = False
                else:
                    progressed = await self.schedule_round()
            except REDIS_ERRORS as exc:
                self._valkey_lost(exc)
                pause = backoff.next(failing_over=failing_over(exc))
            except Exception:  # one bad item or one bug must not end dispatch for the whole group
                self._internal_error("a scheduling round failed")
                pause = backoff.next()
            else:
                self._valkey_back()
                backoff.reset()
                poll = False
                if not progressed:
                    poll = not await self._wait_for_work()
                continue
            poll = False  # a failed round is retried after the backoff, not left to the fleet's poll
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), pause)

    async def _wait_for_work(self) -> bool:
        """Until woken (a token, a config change, stop: True) or the idle poll is due (False).

        Tokens are taken only while a slot is free, so they go to a dispatcher that can use them.
        """
        self._waiting = True
        if len(self.running) < self._slots:
            self._idle.set()
        try:
            async with asyncio.timeout(self.settings.idle_poll_s):  # no task per wait, unlike wait_for
                await self._wake.wait()
            return True
        except TimeoutError:
            # A token taken in the loop turn that ended the wait set ``_wake`` but could not end it:
            # it is a wake-up all the same (dropped, its request would wait for the next idle poll).
            return self._wake.is_set()
        finally:
            self._waiting = False
            self._idle.clear()

    def _woken(self, wake_list: bytes, token: bytes) -> None:
        pool_id = self.tickets.pools.get(wake_list)
        if pool_id is not None:  # a request claimed against our ticket: it starts now, no round
            try:
                self._ticketed(pool_id, token)
            except Exception:  # the waiter carries on; the request's requeue entry stands for REAP
                self._internal_error(f"starting a request claimed by a ticket of pool {pool_id} failed")
            if len(self.running) >= self._slots:
                self._idle.clear()
            return
        self._idle.clear()  # one token per wait: the next is for another dispatcher
        if token != b"1" and self.config is not None:  # a push's request, maybe claimable at once
            pool_id = self._wake_lists_of.of(self.config).pools.get(wake_list)
            self._head_token = (pool_id, token) if pool_id is not None else None
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
            # A durable request requeued while this FINISH waited may run here again under the same member.
            if self.running.get(run.member) is run:
                del self.running[run.member]
            if self.finishing.get(run.member) is run:
                del self.finishing[run.member]
            # No round of our own: FINISH pushed a wake token, which goes to the dispatcher of the
            # group that has waited longest (maybe this one), so freed slots spread over the fleet.
            if self._waiting and len(self.running) < self._slots:
                self._idle.set()

    def _finish_retrying(self, run: Running) -> None:
        """A done call whose FINISH waits for Valkey (failing over) frees its slot for dispatch."""
        if self.running.get(run.member) is run:
            self.finishing[run.member] = self.running.pop(run.member)

    # --- background helpers (their loops: runtime.dispatch.upkeep) -----------------------------------
    def snapshot(self) -> DispatcherSnapshot:
        return build_snapshot(self, now=time.time())

    def _channels(self) -> frozenset[str]:
        """The config channel and the group's cancel channel (wake-ups travel as tokens, not messages)."""
        group_id = self.settings.group_id
        return frozenset([self.keys.config_channel(group_id), self.keys.cancel_channel(group_id)])

    def _wake_lists(self) -> tuple[str, ...]:
        """Our inbox and the wake-up token list of every enabled pool of the group (inboxes first)."""
        config, names = self._waited
        if config is not self.config or not names:
            names = self.tickets.of(self.config).inboxes + self._wake_lists_of.of(self.config).names
            self._waited = (self.config, names)
        return names

    def _on_message(self, channel: str, data: bytes) -> None:
        if channel == self.keys.config_channel(self.settings.group_id):
            if data:
                self._consider_config(data)
            return
        if channel == self.keys.cancel_channel(self.settings.group_id):
            self.executor.cancel(data.decode())
