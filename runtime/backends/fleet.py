"""A dispatcher's view of its group's backends: load gate, shared breaker and scraper together.

Each backend's shared load, shared breaker state and the fleet's in-flight leases to it are read at
the end of every pipeline a scheduling round sends (:meth:`BackendFleet.queue_reads`, riding with
the observation the next decision is made from) and turned into a
:class:`~runtime.backends.status.BackendStatus` (the pure gate's decision included). A round reads
them in a round trip of its own (:meth:`BackendFleet.refresh`) only when the last reading is older
than :data:`STATUS_MAX_AGE_S` or refuses something: a refusal is always decided from a fresh
reading, and a stale "room" lets at most that much older news through: the claim enforces the
in-flight limit and a 429's hold atomically whatever the reading said, so only a breaker opened by
another dispatcher is seen that much later. Before deciding, the dispatcher asks :meth:`blocked` (a
skip reason for the backend's pools) and :meth:`allowance` (how many heads a pool on it may be
offered); its claim script then enforces :meth:`limit` atomically across the fleet.

It is also the one place the dispatcher asks about breakers: a pool on a backend row uses the
fleet's shared breaker, a pool with a bare endpoint URL (no backend row) this process's own
:class:`~runtime.backends.health.EndpointBreakers`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from runtime.backends.breaker import CLOSED
from runtime.backends.gate import SKIP_BACKEND_CAP, hold_ms
from runtime.backends.health import EndpointBreakers
from runtime.backends.scraper import SCRAPE_INTERVAL_S, BackendScraper
from runtime.backends.shared_breaker import SharedBreakers
from runtime.backends.status import READS, BackendStatus, status_from_replies
from runtime.backends.status import queue_reads as queue_backend_reads
from runtime.errors import BackendHTTPError, DispatchError
from runtime.queue.keys import KeySpace
from runtime.valkey.client import REDIS_ERRORS
from runtime.valkey.lua import Commands, run_pipeline
from runtime.wire.backendconfig import BackendConfig

log = logging.getLogger(__name__)

__all__ = ["STATUS_MAX_AGE_S", "BackendFleet"]

# How old a reading that refuses nothing may be and still decide a round. Under load rounds follow
# each other within milliseconds, each bringing the next reading. Load metrics are scraped every
# SCRAPE_INTERVAL_S and accepted up to a second old, the claim checks the in-flight limit and a
# 429's hold itself, so this bounds only how much later a breaker opened by another dispatcher (or
# group) is seen than when every round read it itself; a failure of one of its own calls makes a
# dispatcher read afresh at once.
STATUS_MAX_AGE_S = 0.010


def _nothing_else(pipe: Commands) -> None:
    """A pipeline of the riding reads alone (:meth:`BackendFleet.refresh`)."""


class BackendFleet:
    def __init__(
        self,
        client: aioredis.Redis,
        keys: KeySpace,
        *,
        owner_id: str,
        local: EndpointBreakers,
        clock: Callable[[], float] = time.time,
        scrape_interval_s: float = SCRAPE_INTERVAL_S,
    ) -> None:
        """``local``: the process's breakers of bare endpoint URLs."""
        self.client = client
        self.keys = keys
        self.clock = clock
        self.local = local
        self.breakers = SharedBreakers(client, keys, clock=clock)
        self.scraper = BackendScraper(client, keys, owner_id=owner_id, interval_s=scrape_interval_s)
        self.backends: dict[str, BackendConfig] = {}
        self.statuses: dict[str, BackendStatus] = {}
        self.status_max_age_s = STATUS_MAX_AGE_S
        self.read_at = float("-inf")  # when the last reading was sent (this clock)
        self.refreshes = 0  # readings that took a round trip of their own
        self._distrusted_before = float("-inf")  # readings sent earlier decide no round

    def __repr__(self) -> str:
        held = {b: s.held for b, s in self.statuses.items() if s.held}
        return f"<BackendFleet {sorted(self.backends)} held={held} breakers={self.breakers.modes()}>"

    def configure(self, backends: tuple[BackendConfig, ...]) -> None:
        self.backends = {b.backend_id: b for b in backends}
        self.breakers.configure({b.backend_id: b.breaker_policy() for b in backends})
        self.scraper.configure(backends)
        self.statuses = {b: s for b, s in self.statuses.items() if b in self.backends}

    async def refresh(self) -> None:
        """Each backend's load, breaker and fleet in-flight count, in a pipeline of their own."""
        if not self.backends:
            return
        self.refreshes += 1
        await run_pipeline(self.client, (), _nothing_else, self)

    async def refresh_unless_fresh(self) -> None:
        """:meth:`refresh`, unless the last reading may still decide a round: at most
        :attr:`status_max_age_s` old, of every backend, refusing none."""
        if self.reads_due() or not self._refuses_none():
            await self.refresh()

    def queue_reads(self, pipe: Commands) -> Callable[[list[Any]], None] | None:
        """Queues a reading of every backend on ``pipe`` (see the module doc); what takes its replies."""
        if not self.backends:
            return None
        now = self.clock()
        ids = sorted(self.backends)
        for backend_id in ids:
            queue_backend_reads(pipe, self.keys, backend_id, now)
        return functools.partial(self._take_reading, ids, now)

    def _take_reading(self, ids: list[str], now: float, replies: list[Any]) -> None:
        """A reading sent at ``now``; one older than the last taken (answered out of order) is
        dropped. One sent before a failure of this dispatcher's own was recorded (by a call's task,
        while the round's pipeline was on the wire) may not show its hold or breaker: it is taken in
        but decides no round."""
        if now < self.read_at:
            return
        for i, backend_id in enumerate(ids):
            backend = self.backends.get(backend_id)  # None: removed by a configuration meanwhile
            if backend is None:
                continue
            mine = replies[READS * i : READS * i + READS]
            self.statuses[backend_id] = status_from_replies(backend, mine, now)
            self.breakers.update(backend_id, mine[1])
        if now >= self._distrusted_before:
            self.read_at = now

    def _refuses_none(self) -> bool:
        if self.statuses.keys() != self.backends.keys():
            return False  # a backend never read (just configured)
        return not any(
            self.blocked(backend_id) or self.breakers.state(backend_id).mode != CLOSED
            for backend_id in self.backends
        )

    def blocked(self, backend_id: str) -> str | None:
        """The skip reason for a pool on this backend now (breaker first), None when one may launch."""
        reason = self.breakers.blocked(backend_id)
        if reason:
            return reason
        status = self.statuses.get(backend_id)
        return status.held or None if status else None

    def allowance(self, backend_id: str) -> int | None:
        """Most launches one pool on this backend may be offered now (None: no limit here)."""
        limits = [self.breakers.allowance(backend_id)]
        status = self.statuses.get(backend_id)
        if status is not None:
            limits.append(max(0, status.limit - status.in_flight))
        known = [n for n in limits if n is not None]
        return min(known) if known else None

    def limit(self, backend_id: str) -> int:
        """The in-flight limit the claim enforces fleet-wide (max_in_flight before the first read)."""
        status = self.statuses.get(backend_id)
        if status is not None:
            return status.limit
        backend = self.backends.get(backend_id)
        return backend.max_in_flight if backend else 0

    def ticket_limit(self, backend_id: str) -> int | None:
        """The in-flight limit a standing claim ticket carries for a pool on this backend
        (:mod:`runtime.dispatch.tickets`), or None while only a round may claim for it: never read, held
        (saturated, at its limit, a 429's hold) or its breaker not closed, as last read."""
        status = self.statuses.get(backend_id)
        if status is None or status.held or self.breakers.state(backend_id).mode != CLOSED:
            return None
        return status.limit

    def reads_due(self) -> bool:
        """Whether the last reading is too old to decide a round (:data:`STATUS_MAX_AGE_S`)."""
        return bool(self.backends) and self.clock() - self.read_at > self.status_max_age_s

    def skip_reason(self, backend_id: str) -> str:
        """The skip reason when the claim found the backend's limit reached."""
        status = self.statuses.get(backend_id)
        return status.held if status is not None and status.held else SKIP_BACKEND_CAP

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Per backend, what this dispatcher last saw (for its snapshot)."""
        return {
            b: {
                "held": s.held,
                "limit": s.limit,
                "in_flight": s.in_flight,
                "metrics": s.metrics,
                "breaker": s.breaker,
            }
            for b, s in sorted(self.statuses.items())
        }

    # --- breakers, shared (backend rows) or local (bare URLs) ---------------------------------------
    def refusal(self, backend_id: str, endpoint: str) -> str | None:
        """Why a pool cannot launch now because of its backend, or None."""
        return self.blocked(backend_id) if backend_id else self.local.blocked(endpoint)

    def room(self, backend_id: str, endpoint: str) -> int | None:
        """Most calls a pool may launch now because of its backend (None: no limit)."""
        return self.allowance(backend_id) if backend_id else self.local.allowance(endpoint)

    def acquire_now(self, backend_id: str, endpoint: str) -> bool | None:
        """:meth:`acquire`'s answer when it needs no round trip (a bare URL's breaker, or a shared one
        closed as last read), else None: then await :meth:`acquire`. Saves a coroutine per launch."""
        if not backend_id:
            return self.local.acquire(endpoint)
        return True if self.breakers.state(backend_id).mode == CLOSED else None

    async def acquire(self, backend_id: str, endpoint: str) -> bool:
        """Right before claiming a call: False when its breaker refuses it (may take a probe slot)."""
        if not backend_id:
            return self.local.acquire(endpoint)
        try:
            return await self.breakers.acquire(backend_id)
        except REDIS_ERRORS as exc:  # the claim itself needs Valkey and will say so
            log.warning("backend %s: shared breaker unreadable (%s)", backend_id, exc)
            return True

    async def release(self, backend_id: str, endpoint: str) -> None:
        """Gives back a breaker slot taken for a call that did not happen."""
        if not backend_id:
            self.local.release(endpoint)
            return
        try:
            await self.breakers.release(backend_id)
        except REDIS_ERRORS as exc:
            log.warning("backend %s: shared breaker slot not given back (%s)", backend_id, exc)

    async def record(self, backend_id: str, endpoint: str, error: DispatchError | None) -> None:
        """A call's outcome for its breaker (a deadline cut gives the slot back); a 429's Retry-After
        holds the backend for the whole fleet."""
        if not backend_id:
            self.local.record(endpoint, error)
            return
        if isinstance(error, BackendHTTPError) and error.status_code == 429:
            try:
                await self.hold(backend_id, error.retry_after_s)
            except REDIS_ERRORS as exc:  # the call's own retry still waits its Retry-After
                log.warning("backend %s: its 429's Retry-After not shared (%s)", backend_id, exc)
        try:
            await self.breakers.record(backend_id, error)
        except REDIS_ERRORS as exc:  # the call's reply matters more than the breaker's bookkeeping
            log.warning("backend %s: outcome not recorded in the shared breaker (%s)", backend_id, exc)
        if error is not None and error.retryable:  # its breaker (or a 429's hold) may refuse now
            self.read_again()

    def read_again(self) -> None:
        """The next round reads the backends afresh; a reading already on the wire decides no round."""
        self.read_at = float("-inf")
        self._distrusted_before = self.clock()

    async def hold(self, backend_id: str, retry_after_s: float | None) -> None:
        """Holds the backend's pools across the fleet until its Retry-After is over: the key expires
        then, in Valkey, so no dispatcher's clock decides when. The latest 429 sets the time."""
        ms = hold_ms(retry_after_s)
        if ms:
            await self.client.set(self.keys.backend_hold(backend_id), str(retry_after_s), px=ms)
            log.info("backend %s answered 429: held for %.3gs (Retry-After)", backend_id, ms / 1000)
