"""Valkey operations of the dispatcher: observe the queues, claim exactly what was peeked, finish.

Each operation is one round trip: observation is one pipeline over every pool of the group, a batch
of claims is one pipeline of atomic scripts, and finishing a request (liveness check, reply,
lease release) is one script.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from runtime.dispatch import scripts
from runtime.dispatch.leases import LeaseRecord
from runtime.policy.reads import PoolRead
from runtime.wire.keys import KeySpace


@dataclass(frozen=True, slots=True)
class QueueView:
    """What one observation saw of one pool."""

    backlog: int
    heads: tuple[bytes, ...]  # the first items, read for launching (empty when not read)
    in_flight: int
    heads_read: bool = True  # False: the pool could not launch, so its heads were not read
    display_head: bytes | None = None  # the first item, read only to show its age (pool can't launch)


@dataclass(frozen=True, slots=True)
class Observation:
    views: dict[str, QueueView]
    group_in_flight: int
    lost: tuple[LeaseRecord, ...]  # records of leases that expired unreleased (reaped this time)


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    pool_id: str
    raw: bytes
    mode: str  # "launch" | "drop"
    lease_member: str = ""
    producer_id: str = ""
    pool_max: int = 0
    group_limit: int = 0
    lease_record: bytes = b""


# Expired leases (a killed dispatcher's) are reaped at observation at most this often: lease expiry is
# measured in seconds, so reaping on every round would only add work to the hot path.
REAP_INTERVAL_S = 0.25
HEADS_FOR_DISPLAY = 2  # OBSERVE read only the first item, to show its age


def item_digest(raw: bytes) -> str:
    """The SHA-1 the claim script compares against ``redis.sha1hex`` of the list head."""
    return hashlib.sha1(raw, usedforsecurity=False).hexdigest()


def lease_member(pool_id: str, request_id: str) -> str:
    return f"{pool_id}\x1f{request_id}"


def _evalsha(pipe: Pipeline, script: AsyncScript, keys: list[str], args: list[Any]) -> None:
    pipe.evalsha(script.sha, len(keys), *keys, *args)


class QueueOps:
    """The dispatcher's view of Valkey for one fabric group."""

    def __init__(self, client: aioredis.Redis, keys: KeySpace, group_id: str) -> None:
        self.client = client
        self.keys = keys
        self.group_id = group_id
        self._group_inflight = keys.group_inflight(group_id)
        self._lease_records = keys.lease_records(group_id)
        self._observe = client.register_script(scripts.OBSERVE)
        self._claim = client.register_script(scripts.CLAIM)
        self._finish = client.register_script(scripts.FINISH)
        self._renew = client.register_script(scripts.RENEW)
        self._reap = client.register_script(scripts.REAP)
        self._reaped_at = float("-inf")

    async def observe(self, reads: Sequence[PoolRead], group_limit: int) -> Observation:
        """Backlog, global in-flight and (when the pool could launch) the first heads of each pool,
        the group's in-flight, and the records of leases found expired."""
        reap = time.monotonic() - self._reaped_at >= REAP_INTERVAL_S
        if reap:
            self._reaped_at = time.monotonic()

        def build(pipe: Pipeline) -> None:
            if reap:
                pool_leases = [self.keys.pool_inflight(r.pool_id) for r in reads]
                _evalsha(pipe, self._reap, [self._group_inflight, self._lease_records, *pool_leases], [])
            for read in reads:
                keys = [self.keys.requests(read.pool_id), self.keys.pool_inflight(read.pool_id)]
                args = [read.depth, read.pool_max, group_limit, int(read.display_head)]
                _evalsha(pipe, self._observe, [*keys, self._group_inflight], args)
            pipe.zcard(self._group_inflight)

        results = await self._pipeline(build)
        lost: tuple[LeaseRecord, ...] = ()
        if reap:
            records = (LeaseRecord.decode(raw) for raw in results[0])
            lost = tuple(r for r in records if r is not None)
            results = results[1:]
        views = {}
        for read, (backlog, in_flight, heads_read, heads) in zip(reads, results[:-1], strict=True):
            if heads_read == HEADS_FOR_DISPLAY:
                views[read.pool_id] = QueueView(int(backlog), (), int(in_flight), False, heads[0])
            else:
                views[read.pool_id] = QueueView(int(backlog), tuple(heads), int(in_flight), bool(heads_read))
        return Observation(views, int(results[-1]), lost)

    async def claim(self, requests: Sequence[ClaimRequest], lease_s: float) -> list[tuple[str, int]]:
        """Runs the claim script for each request in order, in one pipeline."""
        if not requests:
            return []

        def build(pipe: Pipeline) -> None:
            for req in requests:
                keys = [
                    self.keys.requests(req.pool_id),
                    self._group_inflight,
                    self.keys.pool_inflight(req.pool_id),
                    self.keys.producer_alive(req.producer_id),
                    self._lease_records,
                ]
                args = [
                    item_digest(req.raw),
                    req.mode,
                    req.lease_member,
                    lease_s,
                    req.pool_max,
                    req.group_limit,
                    req.lease_record,
                ]
                _evalsha(pipe, self._claim, keys, args)

        results = await self._pipeline(build)
        return [(code.decode() if isinstance(code, bytes) else str(code), int(n)) for code, n in results]

    async def _pipeline(self, build: Callable[[Pipeline], None]) -> list[Any]:
        """Runs a pipeline whose scripts are called by SHA, loading them when the server lacks them.

        redis-py's script objects ask SCRIPT EXISTS before every pipeline: one more round trip per
        scheduling round. Here a script is loaded only on first use or after a server restart.
        Retrying is safe: a NOSCRIPT reply means the script did not run.
        """
        try:
            return await self._execute(build)
        except NoScriptError:
            for script in (self._observe, self._claim, self._reap):
                await self.client.script_load(script.script)
            return await self._execute(build)

    async def _execute(self, build: Callable[[Pipeline], None]) -> list[Any]:
        async with self.client.pipeline(transaction=False) as pipe:
            build(pipe)
            return list(await pipe.execute())

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
                self._lease_records,
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
