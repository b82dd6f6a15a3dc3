"""Standing claim tickets: an idle dispatcher's offer to take a pool's next request the moment it is pushed.

A wake token carries the pushed request, and the dispatcher it wakes still spends a CLAIM round trip and
a round before the call starts: at concurrency 1 that was a third of the added latency and of the
dispatcher's CPU per call (bench/RESULTS.md, session 24). A ticket moves the claim into the push:

* while it waits with free slots and at most :data:`TICKET_MAX_RUNNING` calls running, the dispatcher's
  wake waiter posts its ticket in the pool's ticket list, pipelined before each BLPOP (so at most
  :data:`~runtime.dispatch.wakeup.WAKE_BLOCK_S` apart; a ticket lapses after
  :data:`~runtime.queue.keys.TICKET_TTL_MS`);
* a push that makes the list non-empty takes the oldest ticket, checks the caps, the duplicate lease and
  its producer's liveness as CLAIM does, takes the lease and hands the request to that dispatcher's
  inbox (``lua/_ticket_claim.lua``, in the plain push and, after its limits admitted the request, in
  the admitted one: a bounded pool's, a limited ingress key's), which the waiter BLPOPs ahead of the
  wake lists;
* the dispatcher accepts it: the call starts, and the lease record and the end of the claim's requeue
  entry ride before the waiter's next BLPOP. Until then the request is its lease's envelope to requeue,
  so one claimed for a dispatcher that died goes back to the head of its list when its lease expires
  (REAP), instead of being lost;
* one it cannot run (stopping, its pool disabled, malformed, its breaker opened) it gives back to the
  head of its list (``lua/ticket_return.lua``), where a round takes it or drops it, counted;
* stopping, it withdraws its tickets and gives back what its inbox still holds.

Beyond one call in flight rounds batch their claims (one trip for several calls), and a ticket's one
claim per trip costs more than it saves, so tickets stand only at low concurrency. A standing ticket
holds one of the dispatcher's free slots (rounds plan without it), so a ticket's claim never takes the
dispatcher past its slots. Where a claim needs what only a round knows, no ticket stands (see
:func:`ticket_pools`).

Behind a backend row the ticket also names the backend's fleet lease set, its 429 hold and its shared
breaker, and carries the in-flight limit the load gate allows as the dispatcher last read it: the push
takes the backend's lease with the pool's, and claims nothing while the backend is held, at that limit
or its breaker is not closed. The reading rides before the waiter's BLPOP when it is due (no round
reads it at concurrency 1), and a ticket stands only while that reading says the backend may take a
call. A ticket posted before a wait carries that wait's reading, so while its dispatcher idles the limit
may be up to a BLPOP's wait (:data:`~runtime.dispatch.wakeup.WAKE_BLOCK_S`) older than a round's: one
call per standing ticket may pass a limit the load gate lowered meanwhile (the fleet-wide in-flight
count, the hold and the breaker are read by the push itself, fresh).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping

from runtime.queue.keys import TICKET_TTL_MS, KeySpace
from runtime.wire.groupconfig import OFF, GroupConfig

__all__ = ["TICKET_MAX_RUNNING", "Tickets", "split_inbox_item", "ticket_pools", "ticket_text"]

# A ticket stands only while at most this many calls run (see the module doc): at concurrency 1 the
# next call's request can arrive before the last call's FINISH has been answered.
TICKET_MAX_RUNNING = 2
# Free slots a ticket needs: the one it holds, and one left for rounds.
TICKET_MIN_FREE = 2
_TTL_S = TICKET_TTL_MS / 1000

Command = tuple[object, ...]
_NO_LIMITS: Mapping[str, int] = {}


def ticket_pools(config: GroupConfig) -> frozenset[str]:
    """The pools where a ticket may stand: none in durable mode (a claim there also takes a fencing
    token) or in a group with protected slots (a ticket's claim does not check the slots owed to the
    other pools); otherwise the enabled, unpaused pools without tenant fairness. A pool behind a
    backend row holds one only while its backend may take a call (:meth:`Tickets.commands`)."""
    pools = config.enabled_pools
    if config.durable or any(p.min_concurrent > 0 for p in pools):
        return frozenset()
    return frozenset(p.pool_id for p in pools if not p.paused and p.tenant_fairness == OFF)


def ticket_text(fields: tuple[object, ...]) -> str:
    """A ticket as ``lua/_ticket_claim.lua`` reads it: its fields NUL-separated (no key holds a NUL):
    the inbox, the pool's max, the group's limit and the lease's seconds; behind a backend row also the
    backend's lease zset, its 429 hold key, its breaker key and its in-flight limit."""
    return "\0".join(str(field) for field in fields)


def split_inbox_item(item: bytes) -> tuple[str, bytes]:
    """An inbox item's lease member and request (``lua/_ticket_claim.lua`` joins them with a NUL)."""
    member, _, raw = item.partition(b"\0")
    return member.decode(), raw


class Tickets:
    """One dispatcher's tickets: what its waiter sends before each BLPOP, and its inboxes by name."""

    def __init__(self, keys: KeySpace, dispatcher_id: str, group_id: str, lease_s: float) -> None:
        self.keys = keys
        self.dispatcher_id = dispatcher_id
        self.group_id = group_id
        self.lease_s = lease_s
        self._config: GroupConfig | None = None
        # pool -> (its ticket list, this dispatcher's ticket; behind a backend row, all of it but the
        # backend's limit, its last field)
        self._offers: dict[str, tuple[str, str]] = {}
        self.backed: dict[str, str] = {}  # pool -> its backend row, for the pools that hold a ticket
        self.inboxes: tuple[str, ...] = ()
        self.pools: dict[bytes, str] = {}  # inbox name as BLPOP answers it -> pool
        # pool -> when its ticket was last posted (monotonic), its ticket list, the ticket
        self._posted: dict[str, tuple[float, str, str]] = {}
        self._pending: list[Command] = []  # accepts and withdrawals not yet sent

    def __repr__(self) -> str:
        return f"<Tickets {self.dispatcher_id} posted={sorted(self._posted)} pending={len(self._pending)}>"

    def of(self, config: GroupConfig | None) -> Tickets:
        """These tickets for ``config`` (by identity), rebuilt first if they follow another one; tickets
        of pools that no longer qualify are withdrawn before the next BLPOP."""
        if config is self._config:
            return self
        # An inbox lapses (TICKET_TTL_MS) well before its requests' leases expire, so REAP never requeues
        # a request its dispatcher may still take from the inbox.
        long_enough = self.lease_s * 1000 > 2 * TICKET_TTL_MS
        pools = ticket_pools(config) if config is not None and long_enough else frozenset()
        for pool_id in [p for p in self._posted if p not in pools]:
            self._pending += self._withdraw(pool_id)
        total = config.total_concurrency if config is not None else 0
        # Every enabled pool's inbox stays watched: a request claimed just before its pool's ticket was
        # withdrawn (the pool paused, say) still arrives, and is given back.
        self.pools, self._offers, self.backed = {}, {}, {}
        for pool in config.enabled_pools if config is not None else ():
            inbox = self.keys.inbox(self.dispatcher_id, pool.pool_id)
            self.pools[inbox.encode()] = pool.pool_id
            if config is None or pool.pool_id not in pools:
                continue
            fields: tuple[object, ...] = (inbox, pool.max_concurrent, total, self.lease_s)
            backend_id = config.route(pool.pool_id).backend_id
            if backend_id:
                self.backed[pool.pool_id] = backend_id
                fields += (
                    self.keys.backend_inflight(backend_id), self.keys.backend_hold(backend_id),
                    self.keys.backend_breaker(backend_id),
                )  # fmt: skip
            self._offers[pool.pool_id] = (self.keys.tickets(pool.pool_id), ticket_text(fields))
        self.inboxes = tuple(name.decode() for name in self.pools)
        self._config = config
        return self

    def commands(
        self, *, offer: bool, refused: Collection[str] = (), limits: Mapping[str, int] = _NO_LIMITS
    ) -> list[Command]:
        """What to send before the next BLPOP: pending accepts and withdrawals, then this dispatcher's
        ticket in each pool's list (moved to its tail) when ``offer``, but for pools in ``refused``.

        A pool behind a backend row holds one only with its backend's in-flight limit in ``limits``
        (by backend id), given while its backend may take a call; the ticket carries it, and a ticket
        posted with another limit is replaced."""
        commands, self._pending = self._pending, []
        now = time.monotonic()
        for pool_id, (tickets, ticket) in self._offers.items():
            if offer and pool_id not in refused and pool_id in self.backed:
                limit = limits.get(self.backed[pool_id])
                ticket = ticket_text((ticket, limit)) if limit is not None else ""
            if offer and pool_id not in refused and ticket:
                posted = self._posted.get(pool_id)
                commands.append(("LREM", tickets, 0, posted[2] if posted else ticket))
                commands += [("RPUSH", tickets, ticket), ("PEXPIRE", tickets, TICKET_TTL_MS)]
                self._posted[pool_id] = (now, tickets, ticket)
            elif pool_id in self._posted:
                commands += self._withdraw(pool_id)
        return commands

    @property
    def offered(self) -> Collection[str]:
        """The pools where this dispatcher's tickets may stand under the configuration in force."""
        return self._offers.keys()

    def unsent(self, commands: list[Command]) -> None:
        """``commands`` did not reach Valkey: sent again before the next BLPOP."""
        self._pending = [c for c in commands if c[0] in ("HSET", "HDEL", "LREM")] + self._pending

    def accepted(self, member: str, record: bytes) -> None:
        """A request from the pool's inbox is running: its lease record written, its requeue entry gone."""
        self._pending += [
            ("HSET", self.keys.lease_records(self.group_id), member, record),
            ("HDEL", self.keys.durable_leases(self.group_id), member),
        ]

    def received(self, pool_id: str) -> None:
        """The pool's ticket was used up (its request arrived)."""
        self._posted.pop(pool_id, None)

    def holding(self) -> int:
        """Slots held by tickets that may still stand (one per pool posted within the ticket's TTL)."""
        if not self._posted:
            return 0
        now = time.monotonic()
        return sum(1 for at, _, _ in self._posted.values() if now - at < _TTL_S)

    def withdrawal(self) -> list[Command]:
        """Withdraws every ticket and takes what the inboxes still hold (``LPOP`` after the ``LREM``:
        a push that took a ticket has delivered by then), for a stopping dispatcher."""
        commands, self._pending = self._pending, []
        for pool_id in list(self._posted):
            commands += self._withdraw(pool_id)
        return commands + [("LPOP", inbox, 1000) for inbox in self.inboxes]

    def _withdraw(self, pool_id: str) -> list[Command]:
        """Forgets the pool's ticket; the LREM that takes it out of its list."""
        posted = self._posted.pop(pool_id, None)
        return [("LREM", posted[1], 0, posted[2])] if posted is not None else []
