"""Wake one dispatcher, not the whole group: tokens in a short Valkey list that idle dispatchers BLPOP.

Pub/sub woke every dispatcher of a group on every push, and they all raced for the same head (about
one lost claim per completion with three dispatchers). A list hands each token to exactly one
client, and Valkey serves blocked clients in the order they blocked, so the token goes to the
dispatcher that has waited longest: work spreads evenly over the fleet instead of going to whoever
finished a call last.

A token says "a round now could launch something", and only then is one pushed, since every token
costs a round somewhere and two near-simultaneous rounds race for the same head:

* the producer's push (``runtime/queue/lua/push.lua``) wakes a dispatcher only when its request made
  the pool's list non-empty; behind a backlog, a new request changes nothing a round could act on
  (the backlog is served as slots free);
* the FINISH script (a slot freed) wakes one only while some pool of the group has backlog.

A list holds at most :data:`~runtime.queue.keys.WAKE_TOKEN_CAP` tokens, so nobody waiting costs
nothing but one short key. A push's token is the request itself when it is small
(:data:`~runtime.queue.keys.WAKE_HEAD_MAX_BYTES`): a dispatcher alone in its group then claims it in
the round trip that would otherwise only have read it (the claim checks it is still the head).
A fair pool's token (``tenant_fairness`` on) is the request with its tenant's weight ahead
(``<weight> <envelope>``): the claim's charge is divided by it; that claim launches only while the
request's tenant is the pool's pick. A dispatcher that gets no token still polls every
``idle_poll_s`` (deadlines, expired leases and breakers wake nobody).

The token push is one fragment (``runtime/queue/lua/_wake.lua``) that every waking script includes.

Before each BLPOP the waiter sends its ``prelude``: at low concurrency, the dispatcher's standing claim
tickets (:mod:`runtime.dispatch.tickets`), whose claimed requests arrive in inboxes the BLPOP watches
ahead of the wake lists, and reads whose answers go to ``answered`` before the BLPOP's token is
handed on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis

from runtime.backoff import Backoff
from runtime.queue.keys import KeySpace
from runtime.valkey.client import REDIS_ERRORS, dedicated_connection, failing_over
from runtime.wire.groupconfig import GroupConfig

Command = tuple[Any, ...]
# How long one BLPOP blocks; short, so a finished dispatcher's waiter returns soon.
WAKE_BLOCK_S = 0.5


class WakeLists:
    """The wake lists of the configuration in force: the names the waiter BLPOPs, and each list's pool
    by its name as BLPOP answers it (bytes). Built again only when the configuration is replaced: the
    waiter asks for the names before every BLPOP and each token looks its pool up, once per call at
    concurrency 1."""

    __slots__ = ("_config", "_keys", "names", "pools")

    def __init__(self, keys: KeySpace) -> None:
        self._keys = keys
        self._config: GroupConfig | None = None
        self.names: tuple[str, ...] = ()
        self.pools: dict[bytes, str] = {}

    def of(self, config: GroupConfig | None) -> WakeLists:
        """These lists for ``config`` (by identity), rebuilt first if they follow another one."""
        if config is not self._config:
            pools = [p.pool_id for p in config.enabled_pools] if config is not None else []
            self.names = tuple(self._keys.wake_list(pool_id) for pool_id in pools)
            self.pools = {name.encode(): pool_id for name, pool_id in zip(self.names, pools, strict=True)}
            self._config = config
        return self


class WakeWaiter:
    """Blocks on the group's wake lists while the dispatcher is idle; ``on_wake(list, token)`` per token.

    ``idle`` is set by the dispatcher while it waits with free slots. Only then does the waiter
    block, so a token goes to a dispatcher that can use it. Exits on its own once ``finished`` is set
    (a BLPOP cancelled mid-wait could take a token nobody uses). Blocks on a connection of its own
    (:func:`~runtime.valkey.client.dedicated_connection`).
    """

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        keys: Callable[[], Sequence[str]],
        prelude: Callable[[bool], list[Command]] = lambda idle: [],
        answered: Callable[[list[Any]], None] = lambda answers: None,
        unsent: Callable[[list[Command]], None] = lambda commands: None,
        idle: asyncio.Event,
        finished: asyncio.Event,
        on_wake: Callable[[bytes, bytes], None],
        on_error: Callable[[BaseException], None],
        backoff_s: tuple[float, float] = (0.5, 5.0),
    ) -> None:
        self.client = client
        self.keys = keys
        self.prelude = prelude
        self.answered = answered
        self.unsent = unsent
        self.idle = idle
        self.finished = finished
        self.on_wake = on_wake
        self.on_error = on_error
        self.backoff = Backoff(*backoff_s)
        self.tokens = 0

    def __repr__(self) -> str:
        return f"<WakeWaiter tokens={self.tokens} idle={self.idle.is_set()}>"

    async def run(self) -> None:
        own = dedicated_connection(self.client)
        try:
            await self._loop(own)
        finally:
            with contextlib.suppress(*REDIS_ERRORS):
                await own.aclose()

    async def _loop(self, own: Any) -> None:
        while not self.finished.is_set():
            if not self.idle.is_set():
                await self._send(own, self.prelude(False))
                # asyncio.timeout, not wait_for: no task per wait, and this wait runs once per call.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(WAKE_BLOCK_S):
                        await self.idle.wait()
            keys = self.keys()
            if not self.idle.is_set() or not keys:
                continue
            prelude = self.prelude(True)
            commands = [*prelude, ("BLPOP", *keys, WAKE_BLOCK_S)]
            try:
                *answers, token = await own.execute(commands, block_s=WAKE_BLOCK_S)
            except REDIS_ERRORS as exc:
                self.unsent(prelude)
                self.on_error(exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self.finished.wait(), self.backoff.next(failing_over=failing_over(exc))
                    )
                continue
            self.backoff.reset()
            if prelude:
                self.answered(answers)
            if token is not None:
                self.tokens += 1
                self.on_wake(*token)

    async def _send(self, own: Any, commands: list[Command]) -> None:
        """Sends ``commands`` (a ticket's withdrawal, accepts) without a BLPOP behind them."""
        if not commands:
            return
        try:
            await own.execute(commands)
        except REDIS_ERRORS as exc:
            self.unsent(commands)
            self.on_error(exc)
