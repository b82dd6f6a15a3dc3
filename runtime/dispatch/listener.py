"""The dispatcher's ears for the group's config notices over pub/sub.

Config notices carry a new configuration within milliseconds (producers' wake-ups are tokens in a
list instead, so that each wakes one dispatcher: see :mod:`runtime.dispatch.wakeup`). Pub/sub is
best effort, so the group's configuration is also polled, and a broken subscription is re-made with
a pause. The loop exits on its own once the dispatcher has finished (cancelling redis-py mid-command
can hang).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from runtime.backoff import Backoff
from runtime.valkey.client import REDIS_ERRORS, failing_over


class ChangeListener:
    def __init__(
        self,
        client: aioredis.Redis,
        *,
        channels: Callable[[], frozenset[str]],
        on_message: Callable[[str, bytes], None],
        poll: Callable[[], Awaitable[Any]],
        on_error: Callable[[BaseException], None],
        finished: asyncio.Event,
        poll_s: float = 1.0,
        backoff_s: tuple[float, float] = (0.5, 5.0),
    ) -> None:
        self.client = client
        self.channels = channels
        self.on_message = on_message
        self.poll = poll
        self.on_error = on_error
        self.finished = finished
        self.poll_s = poll_s
        self.backoff = Backoff(*backoff_s)
        self.subscribed: frozenset[str] = frozenset()

    def __repr__(self) -> str:
        return f"<ChangeListener channels={len(self.subscribed)}>"

    async def run(self) -> None:
        while not self.finished.is_set():
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                await self._listen(pubsub)
            except REDIS_ERRORS as exc:
                self.on_error(exc)
                self.subscribed = frozenset()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self.finished.wait(), self.backoff.next(failing_over=failing_over(exc))
                    )
            finally:
                with contextlib.suppress(*REDIS_ERRORS):
                    await pubsub.aclose()

    async def _listen(self, pubsub: Any) -> None:
        last_poll = time.monotonic()
        while not self.finished.is_set():
            await self._subscribe(pubsub)
            message = await pubsub.get_message(timeout=self.poll_s)
            self.backoff.reset()
            if message is not None:
                channel = message.get("channel", b"")
                self.on_message(
                    channel.decode() if isinstance(channel, bytes) else str(channel),
                    message.get("data") or b"",
                )
            if time.monotonic() - last_poll >= self.poll_s:
                last_poll = time.monotonic()
                await self.poll()

    async def _subscribe(self, pubsub: Any) -> None:
        """Follows the wanted channel set (it changes when pools are added or removed)."""
        wanted = self.channels()
        if wanted == self.subscribed:
            return
        if stale := self.subscribed - wanted:
            await pubsub.unsubscribe(*stale)
        if new := wanted - self.subscribed:
            await pubsub.subscribe(*new)
        self.subscribed = wanted
