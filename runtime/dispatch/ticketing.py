"""The dispatcher's side of its standing claim tickets (:mod:`runtime.dispatch.tickets`): what its wake
waiter sends before each BLPOP, a request that arrives claimed in its inbox started (or given back), and
the tickets withdrawn when it stops.

:class:`Ticketing` is a part of :class:`~runtime.dispatch.dispatcher.Dispatcher`, kept in a module of
its own; the attributes it reads are declared here and set by the dispatcher.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from runtime.backends.fleet import BackendFleet
from runtime.config import DispatcherSettings
from runtime.dispatch.peek import PeekCache
from runtime.dispatch.running import RunningCalls
from runtime.dispatch.stats import DispatcherStats
from runtime.dispatch.tickets import TICKET_MAX_RUNNING, TICKET_MIN_FREE, Tickets, split_inbox_item
from runtime.queue.keys import KeySpace
from runtime.queue.leases import LeaseRecord
from runtime.queue.ticket_return import return_ticketed
from runtime.telemetry.spans import Identity
from runtime.valkey.client import REDIS_ERRORS
from runtime.valkey.lua import Commands
from runtime.wire.groupconfig import GroupConfig

__all__ = ["Ticketing"]


class Ticketing:
    """The tickets' half of the dispatcher (see the module doc)."""

    client: aioredis.Redis
    keys: KeySpace
    config: GroupConfig | None
    settings: DispatcherSettings
    identity: Identity
    stats: DispatcherStats
    fleet: BackendFleet
    running: RunningCalls
    tickets: Tickets
    _reading: tuple[int, Callable[[list[Any]], None]] | None  # the backends' reading on the wire
    _peek: PeekCache
    _slots: int
    _stopping: asyncio.Event
    _tasks: set[asyncio.Task[None]]
    _start: Callable[..., None]
    _refusal: Callable[[str], str | None]
    _reap: Callable[[asyncio.Task[None]], None]
    _valkey_lost: Callable[[BaseException], None]
    _internal_error: Callable[[str], None]

    def _ticket_commands(self, idle: bool) -> list[tuple[object, ...]]:
        """What the wake waiter sends before its next BLPOP: our tickets while we wait with room for
        them (else their withdrawal), and the accepts of requests that arrived. Behind a backend row a
        ticket stands only while the backend may take a call as last read, so the backends' reading
        rides along when it is due: at low concurrency no round reads it."""
        tickets = self.tickets.of(self.config)
        running = len(self.running)
        offer = (
            idle
            and self.settings.claim_tickets
            and not self._stopping.is_set()
            and running <= TICKET_MAX_RUNNING
            and self._slots - running >= TICKET_MIN_FREE
        )
        if not offer:
            return tickets.commands(offer=False)
        refused = [p for p in tickets.offered if self._refusal(p) is not None]
        if not tickets.backed:
            return tickets.commands(offer=True, refused=refused)
        limits = {}
        for backend_id in set(tickets.backed.values()):
            limit = self.fleet.ticket_limit(backend_id)
            if limit is not None:
                limits[backend_id] = limit
        commands = tickets.commands(offer=True, refused=refused, limits=limits)
        if self.fleet.reads_due():
            reads = Commands()
            take = self.fleet.queue_reads(reads)
            if take is not None:
                commands += reads.calls
                self._reading = (len(reads.calls), take)
        return commands

    def _ticket_answers(self, answers: list[object]) -> None:
        """The answers to what :meth:`_ticket_commands` sent: the backends' reading, if it rode along."""
        reading, self._reading = self._reading, None
        if reading is not None:
            count, take = reading
            try:
                take(answers[len(answers) - count :])
            except Exception:  # the waiter goes on: the next reading rides the next BLPOP
                self._internal_error("taking the backends' reading from the wake waiter failed")

    def _ticket_commands_unsent(self, commands: list[tuple[object, ...]]) -> None:
        self._reading = None
        self.tickets.unsent(commands)

    def _ticketed(self, pool_id: str, item: bytes) -> None:
        """Starts a request a push claimed against our ticket, or gives it back when it may not run."""
        self.tickets.received(pool_id)
        member, raw = split_inbox_item(item)
        peeked = self._peek.get(raw)
        self._peek.forget(raw)
        envelope, config = peeked.envelope, self.config
        runnable = (
            envelope is not None
            and config is not None
            and not self._stopping.is_set()
            and pool_id in self.tickets.offered
            and (envelope.deadline is None or envelope.deadline > time.time())
        )
        if runnable:
            assert config is not None
            route = config.route(pool_id)
            runnable = self.fleet.acquire_now(route.backend_id, route.endpoint) is True
        if not runnable:
            self._give_back_ticketed([(pool_id, self._backend_of(pool_id), member, raw)])
            return
        assert envelope is not None
        record = LeaseRecord.encode_of(
            envelope, pool_id=pool_id, claimed_at=time.time(), dispatcher_id=self.identity.dispatcher_id,
            cost=peeked.cost,
        )  # fmt: skip
        self.tickets.accepted(member, record)
        self.stats.ticket_claims += 1
        self._start(envelope, pool_id, member, peeked.cost)

    def _backend_of(self, pool_id: str) -> str:
        """The backend row the pool's calls go to ("" for a bare URL): the lease a give-back removes. After
        a configuration moved the pool to another row, the old row's lease expires on its own."""
        return self.config.route(pool_id).backend_id if self.config is not None else ""

    def _give_back_ticketed(self, returns: list[tuple[str, str, str, bytes]]) -> None:
        task = asyncio.create_task(self._return_ticketed(returns))
        self._tasks.add(task)
        task.add_done_callback(self._reap)

    async def _return_ticketed(self, returns: list[tuple[str, str, str, bytes]]) -> None:
        try:
            self.stats.tickets_given_back += await return_ticketed(
                self.client, self.keys, self.settings.group_id, returns
            )
        except REDIS_ERRORS as exc:  # their leases' requeue entries stand: REAP puts them back
            self._valkey_lost(exc)

    async def _withdraw_tickets(self) -> None:
        """Stopping: our tickets withdrawn, and what our inboxes still hold given back. On a Valkey
        error the tickets lapse and REAP requeues what the inboxes held once their leases expire."""
        commands = self.tickets.withdrawal()
        inboxes = self.tickets.inboxes
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for command in commands:
                    pipe.execute_command(*command)
                answers = await pipe.execute()
            left = answers[len(answers) - len(inboxes) :]
            pools = [self.tickets.pools[inbox.encode()] for inbox in inboxes]
            returns = [
                (pool_id, self._backend_of(pool_id), *split_inbox_item(item))
                for pool_id, items in zip(pools, left, strict=True)
                for item in items or ()
            ]
            if returns:
                await self._return_ticketed(returns)
        except REDIS_ERRORS as exc:
            self._valkey_lost(exc)
