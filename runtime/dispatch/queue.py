"""Valkey operations of the dispatcher: observe the queues, claim exactly what was peeked, finish.

Each operation is one round trip: observation is one pipeline over every pool of the group, a batch
of claims is one pipeline of atomic scripts, and finishing a request (liveness check, reply,
lease release) is one script.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from runtime.dispatch import scripts
from runtime.wire.keys import KeySpace


@dataclass(frozen=True, slots=True)
class QueueView:
    """What one observation saw of one pool."""

    backlog: int
    heads: tuple[bytes, ...]
    in_flight: int


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    pool_id: str
    raw: bytes
    mode: str  # "launch" | "drop"
    lease_member: str = ""
    producer_id: str = ""
    pool_max: int = 0
    group_limit: int = 0


# Expired leases (a killed dispatcher's) are reaped at observation at most this often: lease expiry is
# measured in seconds, so reaping on every round would only add work to the hot path.
REAP_INTERVAL_S = 0.25


def item_digest(raw: bytes) -> str:
    """The SHA-1 the claim script compares against ``redis.sha1hex`` of the list head."""
    return hashlib.sha1(raw, usedforsecurity=False).hexdigest()


def lease_member(pool_id: str, request_id: str) -> str:
    return f"{pool_id}\x1f{request_id}"


class QueueOps:
    """The dispatcher's view of Valkey for one fabric group."""

    def __init__(self, client: aioredis.Redis, keys: KeySpace, group_id: str) -> None:
        self.client = client
        self.keys = keys
        self.group_id = group_id
        self._group_inflight = keys.group_inflight(group_id)
        self._claim = client.register_script(scripts.CLAIM)
        self._finish = client.register_script(scripts.FINISH)
        self._renew = client.register_script(scripts.RENEW)
        self._reap = client.register_script(scripts.REAP)
        self._reaped_at = float("-inf")

    async def observe(self, pool_ids: Sequence[str], depth: int) -> tuple[dict[str, QueueView], int]:
        """Backlog, the first ``depth`` items and global in-flight of each pool, and the group's in-flight."""
        reap = time.monotonic() - self._reaped_at >= REAP_INTERVAL_S
        async with self.client.pipeline(transaction=False) as pipe:
            if reap:
                self._reaped_at = time.monotonic()
                await self._reap(
                    keys=[self._group_inflight, *(self.keys.pool_inflight(p) for p in pool_ids)],
                    args=[],
                    client=pipe,
                )
            for pool_id in pool_ids:
                queue = self.keys.requests(pool_id)
                pipe.llen(queue)
                pipe.lrange(queue, 0, depth - 1)
                pipe.zcard(self.keys.pool_inflight(pool_id))
            pipe.zcard(self._group_inflight)
            results = await pipe.execute()
        if reap:
            results = results[1:]  # the reap count
        views = {
            pool_id: QueueView(int(results[3 * i]), tuple(results[3 * i + 1]), int(results[3 * i + 2]))
            for i, pool_id in enumerate(pool_ids)
        }
        return views, int(results[-1])

    async def claim(self, requests: Sequence[ClaimRequest], lease_s: float) -> list[tuple[str, int]]:
        """Runs the claim script for each request in order, in one pipeline."""
        if not requests:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for req in requests:
                await self._claim(
                    keys=[
                        self.keys.requests(req.pool_id),
                        self._group_inflight,
                        self.keys.pool_inflight(req.pool_id),
                        self.keys.producer_alive(req.producer_id),
                    ],
                    args=[
                        item_digest(req.raw),
                        req.mode,
                        req.lease_member,
                        lease_s,
                        req.pool_max,
                        req.group_limit,
                    ],
                    client=pipe,
                )
            results = await pipe.execute()
        return [(code.decode() if isinstance(code, bytes) else str(code), int(n)) for code, n in results]

    async def finish(
        self, *, pool_id: str, producer_id: str, member: str, reply: bytes, reply_ttl_s: float
    ) -> bool:
        """Releases the lease and delivers the reply if the producer is alive; False if it was dropped."""
        delivered = await self._finish(
            keys=[
                self.keys.producer_alive(producer_id),
                self.keys.replies(producer_id),
                self._group_inflight,
                self.keys.pool_inflight(pool_id),
            ],
            args=[reply, int(reply_ttl_s * 1000), member],
        )
        return bool(int(delivered))

    async def renew(self, leases: Sequence[tuple[str, str]], lease_s: float) -> None:
        """Extends the leases (pool id, member) this dispatcher still holds."""
        if not leases:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for pool_id, member in leases:
                await self._renew(
                    keys=[self._group_inflight, self.keys.pool_inflight(pool_id)],
                    args=[lease_s, member],
                    client=pipe,
                )
            await pipe.execute()
