"""Lua scripts run by SHA: loaded once, EVALSHA on the hot path, reloaded after a NOSCRIPT.

redis-py's ``Script`` in a pipeline sends ``SCRIPT EXISTS`` before every execution: one extra round
trip per claim batch. :func:`run_pipeline` instead queues plain ``EVALSHA`` commands. A command the
server refuses with NOSCRIPT (after a restart or ``SCRIPT FLUSH``) did not run, so the scripts are
loaded and exactly the refused commands run once more; the others keep their results. Calls refused
together (the first burst after a start, a Valkey restart or a failover: thousands at once) wait for
one load of each script instead of sending one each: a producer with 4,000 submits outstanding sent
4,000 SCRIPT LOADs through its 64 pooled connections, and its liveness refresh, queued behind them,
came too late; dispatchers dropped its calls as ``producer_gone`` (bench/pump_stall.py).
A refusal read after that load finished, of a command sent before it finished, sends again without
loading: the EVALSHA's answer and the SCRIPT LOAD's come back on different connections, in either order.

The commands go over the client's shared :class:`~runtime.valkey.pipelined.PipelinedConnection` when
it has one (clients made by :func:`runtime.valkey.client.connect`), else through a redis-py pipeline.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

__all__ = ["BoundScript", "Commands", "LuaScript", "RidingReads", "run_pipeline"]

# Per client: the SCRIPT LOADs under way and when each script last finished loading.
_LOADS: weakref.WeakKeyDictionary[Any, _Loads] = weakref.WeakKeyDictionary()
# A send, a load on refusal, a send again, and once more should a flush fall between: then it raises.
_SENDS = 3


class Commands:
    """The commands of one pipeline, recorded so that refused ones can be sent again."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def zcard(self, key: str) -> None:
        self.calls.append(("ZCARD", key))

    def get(self, key: str) -> None:
        self.calls.append(("GET", key))

    def zcount(self, key: str, low: str, high: str) -> None:
        self.calls.append(("ZCOUNT", key, low, high))

    def pttl(self, key: str) -> None:
        self.calls.append(("PTTL", key))

    def set_nx(self, key: str, value: bytes, px: int) -> None:
        """SET ``key`` ``value`` NX PX ``px``: answers OK when set, None when the key existed."""
        self.calls.append(("SET", key, value, "NX", "PX", px))


class LuaScript:
    """One script's source and SHA-1; ``queue`` adds an EVALSHA of it to the commands."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()

    def __repr__(self) -> str:
        return f"<LuaScript {self.sha[:10]}>"

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The EVALSHA command that runs this script on ``keys`` and ``args``."""
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def queue(self, commands: Commands, keys: Sequence[str], args: Sequence[Any]) -> None:
        commands.calls.append(self.command(keys, args))

    def bind(self, client: aioredis.Redis) -> BoundScript:
        return BoundScript(self, client)


class BoundScript:
    """A script and the client it runs on, called like redis-py's ``AsyncScript``:
    ``await script(keys=[...], args=[...])``; by SHA, loaded again on NOSCRIPT."""

    __slots__ = ("client", "script")

    def __init__(self, script: LuaScript, client: aioredis.Redis) -> None:
        self.script = script
        self.client = client

    async def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        [result] = await _run(self.client, [self.script], [self.script.command(keys, args)])
        return result


class RidingReads(Protocol):
    """Reads another part of the process wants as fresh as a pipeline's own answers (the backends'
    statuses: :class:`~runtime.backends.fleet.BackendFleet`), sent at the end of pipelines that go
    out anyway rather than in a round trip of their own."""

    def queue_reads(self, pipe: Commands) -> Callable[[list[Any]], None] | None:
        """Queues the reads on ``pipe``; what takes their replies, in order (None: nothing queued)."""


async def run_pipeline(
    client: aioredis.Redis,
    scripts: Sequence[LuaScript],
    build: Callable[[Any], None],
    riding: RidingReads | None = None,
) -> list[Any]:
    """Runs the commands ``build`` records in one non-transactional pipeline; reloads on NOSCRIPT.
    ``riding``'s reads go at its end: their replies are handed to it, not returned.

    Other errors are raised, like ``pipe.execute()`` does.
    """
    commands = Commands()
    build(commands)
    own = len(commands.calls)
    take = riding.queue_reads(commands) if riding is not None else None
    results = await _run(client, scripts, commands.calls)
    if take is not None:
        take(results[own:])
        del results[own:]
    return results


async def _run(
    client: aioredis.Redis, scripts: Sequence[LuaScript], calls: Sequence[tuple[Any, ...]]
) -> list[Any]:
    loads = _LOADS.get(client) or _LOADS.setdefault(client, _Loads())
    sent_at = loads.finished
    results = await _execute(client, calls)
    for _ in range(_SENDS - 1):  # the hot path: no refusal, no copy of the commands
        refused = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if not refused:
            break
        for script in scripts:
            await loads.ensure(client, script, sent_at)
        sent_at = loads.finished
        again = await _execute(client, [calls[i] for i in refused])
        for i, result in zip(refused, again, strict=True):
            results[i] = result
    for result in results:
        if isinstance(result, Exception):
            raise result
    return results


class _Loads:
    """One client's script loads. Calls refused together share one SCRIPT LOAD per script, and so
    does a refusal read after that load finished when the command went out before it did: answers on
    two connections (the refused EVALSHA's and the SCRIPT LOAD's) reach the loop in either order.

    ``finished`` counts the loads finished; a script's entry in ``loaded`` is that count just after its
    last load. A refusal of a command sent when the count was ``sent_at`` is then answered by sending it
    again if its script finished loading since (a later flush is refused anew, and loads again).
    """

    __slots__ = ("finished", "loaded", "pending")

    def __init__(self) -> None:
        self.finished = 0
        self.loaded: dict[str, int] = {}
        self.pending: dict[str, asyncio.Future[Any]] = {}

    async def ensure(self, client: aioredis.Redis, script: LuaScript, sent_at: int) -> None:
        """Loads ``script`` unless it finished loading after ``sent_at``; waits for a load under way."""
        pending = self.pending.get(script.sha)
        if pending is None or pending.get_loop() is not asyncio.get_running_loop():
            if self.loaded.get(script.sha, 0) > sent_at:
                return
            pending = asyncio.ensure_future(client.script_load(script.source))
            self.pending[script.sha] = pending
            pending.add_done_callback(functools.partial(self._done, script.sha))
        # Shielded: a caller cancelled while waiting leaves the load to the others waiting for it.
        await asyncio.shield(pending)

    def _done(self, sha: str, future: asyncio.Future[Any]) -> None:
        if self.pending.get(sha) is future:
            del self.pending[sha]
        if not future.cancelled() and future.exception() is None:
            self.finished += 1
            self.loaded[sha] = self.finished


async def _execute(client: aioredis.Redis, calls: Sequence[tuple[Any, ...]]) -> list[Any]:
    pipelined = getattr(client, "pipelined", None)
    if pipelined is not None:
        return await pipelined.execute(calls)
    async with client.pipeline(transaction=False) as pipe:
        for call in calls:
            pipe.execute_command(*call)
        return list(await pipe.execute(raise_on_error=False))
