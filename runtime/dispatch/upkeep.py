"""The dispatcher's background upkeep: its leases renewed, due retries promoted, snapshots published.

Each runs as a helper task of :meth:`~runtime.dispatch.dispatcher.Dispatcher.run` until the dispatcher
has finished (its in-flight calls done), and survives Valkey outages (counted through
``_valkey_lost``, retried at its next tick). :class:`Upkeep` is a part of the dispatcher, kept in a
module of its own; the attributes it reads are declared here and set by the dispatcher.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from runtime.config import DispatcherSettings
from runtime.dispatch import redelivery
from runtime.dispatch.running import Running, RunningCalls
from runtime.dispatch.snapshot import DispatcherSnapshot, SnapshotStore
from runtime.dispatch.stats import DispatcherStats
from runtime.queue.dispatching import QueueOps
from runtime.valkey.client import REDIS_ERRORS
from runtime.wire.groupconfig import GroupConfig

__all__ = ["RETRY_POLL_S", "Upkeep"]

# Due retries are moved back into their lists this often: a retry waits its backoff, plus at most this.
RETRY_POLL_S = 0.05


class Upkeep:
    """The background helpers' half of the dispatcher (see the module doc)."""

    settings: DispatcherSettings
    config: GroupConfig | None
    queue: QueueOps
    stats: DispatcherStats
    redeliveries: redelivery.Redeliveries
    publisher: SnapshotStore
    running: RunningCalls
    finishing: dict[str, Running]
    _finished: asyncio.Event
    _wake: asyncio.Event
    _valkey_lost: Callable[[BaseException], None]
    give_back_unanswered: Callable[[], Awaitable[None]]
    snapshot: Callable[[], DispatcherSnapshot]

    async def _pause(self, seconds: float) -> bool:
        """Sleeps up to ``seconds``; True once the dispatcher has finished and helpers should return."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._finished.wait(), seconds)
        return self._finished.is_set()

    async def _renew_leases(self) -> None:
        while not await self._pause(self.settings.lease_s / 3):
            runs = [*self.running.values(), *self.finishing.values()]
            leases = [(r.pool_id, r.member, r.backend_id) for r in runs]
            try:
                await self.queue.renew(leases, self.settings.lease_s)
                await self.give_back_unanswered()
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

    async def _publish_snapshot_once(self) -> None:
        if self.config is not None:
            await self.publisher.publish(self.snapshot(), self.stats)
