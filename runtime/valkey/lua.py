"""Lua scripts run by SHA: loaded once, EVALSHA on the hot path, reloaded after a NOSCRIPT.

redis-py's ``Script`` in a pipeline sends ``SCRIPT EXISTS`` before every execution: one extra round
trip per claim batch. :func:`run_pipeline` instead queues plain ``EVALSHA`` commands. A command the
server refuses with NOSCRIPT (after a restart or ``SCRIPT FLUSH``) did not run, so the scripts are
loaded and exactly the refused commands run once more; the others keep their results.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

__all__ = ["Commands", "LuaScript", "run_pipeline"]


class Commands:
    """The commands of one pipeline, recorded so that refused ones can be sent again."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        def record(*args: Any) -> None:
            self.calls.append((name, args))

        return record


class LuaScript:
    """One script's source and SHA-1; ``queue`` adds an EVALSHA of it to the commands."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()

    def __repr__(self) -> str:
        return f"<LuaScript {self.sha[:10]}>"

    def queue(self, commands: Any, keys: Sequence[str], args: Sequence[Any]) -> None:
        commands.evalsha(self.sha, len(keys), *keys, *args)


async def run_pipeline(
    client: aioredis.Redis, scripts: Sequence[LuaScript], build: Callable[[Any], None]
) -> list[Any]:
    """Runs the commands ``build`` records in one non-transactional pipeline; reloads on NOSCRIPT.

    Other errors are raised, like ``pipe.execute()`` does.
    """
    commands = Commands()
    build(commands)
    results = await _execute(client, commands.calls)
    refused = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
    if refused:
        for script in scripts:
            await client.script_load(script.source)
        again = await _execute(client, [commands.calls[i] for i in refused])
        for i, result in zip(refused, again, strict=True):
            results[i] = result
    for result in results:
        if isinstance(result, Exception):
            raise result
    return results


async def _execute(client: aioredis.Redis, calls: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Any]:
    async with client.pipeline(transaction=False) as pipe:
        for name, args in calls:
            getattr(pipe, name)(*args)
        return list(await pipe.execute(raise_on_error=False))
