"""The producer's heartbeat: ``key:llm:producer:{producer_id}:alive`` kept fresh while it can receive replies.

Each refresh also renews the leases of the ingress keys its requests hold and retries the durable pushes
answered without their persistence counted (both live as long as the producer does). A part of
:class:`~runtime.producer.core.Producer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from runtime.producer.enqueue import Enqueuer
from runtime.valkey.client import REDIS_ERRORS

__all__ = ["Liveness"]

log = logging.getLogger(__name__)


class Liveness:
    """Marks one producer alive, refreshes the mark every ``alive_refresh_s`` and deletes it on close."""

    def __init__(self, enqueue: Enqueuer) -> None:
        """Speaks for ``enqueue``'s producer, over its connection and with its settings."""
        self.client = enqueue.client
        self.keys = enqueue.keys
        self.producer_id = enqueue.producer_id
        self.settings = enqueue.settings
        self._enqueue = enqueue
        self.alive_key = self.keys.producer_alive(self.producer_id)
        self._closing = asyncio.Event()

    def __repr__(self) -> str:
        return f"<Liveness {self.alive_key!r} {'closing' if self._closing.is_set() else 'running'}>"

    async def mark_alive(self) -> None:
        ttl_ms = int(self.settings.alive_ttl_s * 1000)
        await self.client.set(self.alive_key, b"1", px=ttl_ms)

    async def run(self) -> None:
        """Refreshes until :meth:`stop`; a refresh Valkey refuses is logged and tried again next time."""
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.settings.alive_refresh_s)
            if self._closing.is_set():
                return
            try:
                await self.mark_alive()
                await self._enqueue.key_leases.renew()
                await self._enqueue.flush_unpersisted()
            except REDIS_ERRORS as exc:
                log.warning("producer %s could not refresh liveness: %s", self.producer_id, exc)

    def stop(self) -> None:
        """Ends :meth:`run` at its next step (it wakes at once from its pause)."""
        self._closing.set()

    async def forget(self) -> None:
        """Deletes the liveness marker and the pump's taken/acked lists: no reply is wanted any more."""
        await self.client.delete(
            self.alive_key,
            self.keys.replies_taken(self.producer_id),
            self.keys.replies_acked(self.producer_id),
        )
