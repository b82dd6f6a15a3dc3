"""Pushes acknowledged only once Valkey has them persisted: the push script and a ``WAITAOF`` in one write.

A ``durable`` group's producer answers its caller only after Valkey has fsynced the push to its
append-only file (``WAITAOF 1 <replicas> <timeout>``, Valkey >= 8 and Redis >= 7.2) and, when the group
asks for replicas, after that many replicas have it too. ``WAITAOF`` blocks the connection it is sent
on until the fsync (up to a second under ``appendfsync everysec``), so it never goes over the shared
hot-path connection: durable pushes have a connection of their own, and the pushes that arrive while
one ``WAITAOF`` waits are written together, followed by a single ``WAITAOF`` (a group commit: one fsync
confirms the whole batch).

What each batch got is counted in :attr:`PersistedPusher.outcomes` by :data:`OUTCOMES`. A server
without ``WAITAOF`` (Redis 7.0) is detected from its first answer on each connection; from then on the
push is acknowledged once it is in memory (``WAIT <replicas>`` still runs when replicas are asked for),
counted ``waitaof_unsupported``. A server with its AOF switched off is counted ``aof_off`` the same
way, and a ``WAITAOF`` that times out short of what was asked ``not_persisted``: the request is queued
either way (the push ran), so the producer does not fail it, which would invite a duplicate.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from runtime.valkey.client import dedicated_connection
from runtime.valkey.lua import LuaScript

__all__ = ["OUTCOMES", "PERSISTED", "PersistedPusher"]

log = logging.getLogger(__name__)

PERSISTED = "persisted"
WAITAOF_UNSUPPORTED = "waitaof_unsupported"  # the server has no WAITAOF: in memory (and WAIT replicas)
AOF_OFF = "aof_off"  # the server persists nothing locally (appendonly no)
NOT_PERSISTED = "not_persisted"  # WAITAOF/WAIT answered short of what was asked within the timeout
OUTCOMES = (PERSISTED, WAITAOF_UNSUPPORTED, AOF_OFF, NOT_PERSISTED)


@dataclass(slots=True)
class _Push:
    command: tuple[Any, ...]
    replicas: int
    future: asyncio.Future[tuple[Any, str]]


@dataclass(slots=True)
class _Support:
    """What this connection's server can do, learned from its answers (None: not known yet)."""

    waitaof: bool | None = None
    aof: bool = True


class PersistedPusher:
    """Runs push scripts on a connection of its own, each written batch followed by one ``WAITAOF``."""

    def __init__(self, client: aioredis.Redis, *, timeout_s: float = 2.0) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self.outcomes: Counter[str] = Counter()
        self._support = _Support()
        self._pending: list[_Push] = []
        self._runner: asyncio.Task[None] | None = None
        self._conn: Any = None

    def __repr__(self) -> str:
        support = {None: "unknown", True: "WAITAOF", False: "no WAITAOF"}[self._support.waitaof]
        return f"<PersistedPusher {support} pending={len(self._pending)} {dict(self.outcomes)}>"

    async def push(
        self, script: LuaScript, keys: Sequence[Any], args: Sequence[Any], *, replicas: int
    ) -> tuple[Any, str]:
        """The script's answer and its outcome (one of :data:`OUTCOMES`), once persisted as asked."""
        # EVAL with the source: the connection is its own, and a restarted server has no script cache.
        command = ("EVAL", script.source, len(keys), *keys, *args)
        future: asyncio.Future[tuple[Any, str]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Push(command, replicas, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="persisted-push")
        return await future

    async def aclose(self) -> None:
        if self._runner is not None:
            await asyncio.wait([self._runner], timeout=self.timeout_s + 1)
        if self._conn is not None:
            await self._conn.aclose()

    async def _run(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await self._send(batch)
            except Exception as exc:  # never lost in the task: every waiter of the batch gets it
                for push in batch:
                    if not push.future.done():
                        push.future.set_exception(exc)

    async def _send(self, batch: list[_Push]) -> None:
        if self._conn is None:
            self._conn = dedicated_connection(self.client)
        replicas = max(push.replicas for push in batch)
        wait = self._wait_command(replicas)
        commands = [push.command for push in batch] + ([wait] if wait else [])
        try:
            answers = await self._conn.execute(commands, block_s=self.timeout_s)
        except RedisConnectionError:
            self._support = _Support()  # another server may answer the next connection: learn it again
            raise
        outcome = self._outcome(wait, answers[-1], replicas) if wait else self._unwaited()
        self.outcomes[outcome] += len(batch)
        for push, answer in zip(batch, answers, strict=False):
            if push.future.done():  # its caller was cancelled meanwhile (the push ran all the same)
                continue
            if isinstance(answer, Exception):
                push.future.set_exception(answer)
            else:
                push.future.set_result((answer, outcome))

    def _wait_command(self, replicas: int) -> tuple[Any, ...] | None:
        timeout_ms = int(self.timeout_s * 1000)
        if self._support.waitaof is not False:
            return ("WAITAOF", 1 if self._support.aof else 0, replicas, timeout_ms)
        return ("WAIT", replicas, timeout_ms) if replicas else None

    def _unwaited(self) -> str:
        return WAITAOF_UNSUPPORTED if self._support.waitaof is False else AOF_OFF

    def _outcome(self, wait: tuple[Any, ...], answer: Any, replicas: int) -> str:
        if isinstance(answer, ResponseError):
            return self._learn(answer)
        if wait[0] == "WAIT":
            return PERSISTED if int(answer) >= replicas else NOT_PERSISTED
        local, copies = int(answer[0]), int(answer[1])
        self._support.waitaof = True
        if not self._support.aof:
            return AOF_OFF if copies >= replicas else NOT_PERSISTED
        return PERSISTED if local >= 1 and copies >= replicas else NOT_PERSISTED

    def _learn(self, error: ResponseError) -> str:
        """What a refused WAITAOF says about the server; the next batch asks what it can answer."""
        text = str(error).lower()
        if "appendonly" in text:
            self._support.aof = False
            log.warning("Valkey has its AOF off: durable pushes are not persisted locally (counted aof_off)")
            return AOF_OFF
        if "unknown command" in text:
            self._support.waitaof = False
            log.warning(
                "Valkey has no WAITAOF (Redis < 7.2): durable pushes are acknowledged once in memory "
                "(counted waitaof_unsupported)"
            )
            return WAITAOF_UNSUPPORTED
        raise error
