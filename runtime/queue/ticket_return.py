"""Requests a push claimed against a dispatcher's standing ticket that the dispatcher will not run, given
back to the head of their lists (``lua/ticket_return.lua``; see :mod:`runtime.dispatch.tickets`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from runtime.queue.keys import WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS, KeySpace
from runtime.queue.registry import script
from runtime.valkey.lua import run_pipeline

__all__ = ["return_ticketed"]


async def return_ticketed(
    client: aioredis.Redis, keys: KeySpace, group_id: str, returns: Sequence[tuple[str, str, str, bytes]]
) -> int:
    """Gives back each (pool id, backend id or "", lease member, request), one pipeline; how many were
    given back (one whose requeue entry is gone, requeued by REAP already, is not)."""
    ticket_return = script("ticket_return")

    def build(pipe: Any) -> None:
        for pool_id, backend_id, member, raw in returns:
            script_keys = [
                keys.requests(pool_id), keys.wake_list(pool_id), keys.group_inflight(group_id),
                keys.pool_inflight(pool_id), keys.durable_leases(group_id),
            ]  # fmt: skip
            if backend_id:
                script_keys.append(keys.backend_inflight(backend_id))
            ticket_return.queue(pipe, script_keys, [member, raw, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS])

    return sum(int(n) for n in await run_pipeline(client, [ticket_return], build))
