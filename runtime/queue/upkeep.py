"""The dispatcher's queue upkeep beside its rounds: the idle poll, lease renewal (and leases given back
after a reap of its own), due retries promoted, dead letters.

:class:`Upkeep` is a part of :class:`~runtime.queue.dispatching.QueueOps`, kept in a module of its
own; the attributes it reads are declared here and set by ``QueueOps``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from runtime.queue.dispatch_requests import bury_args, promote_args
from runtime.queue.keys import KeySpace
from runtime.queue.tenant_dispatch import FairPick, bury_fair_args, promote_call
from runtime.valkey.lua import LuaScript, run_pipeline


class Upkeep:
    client: aioredis.Redis
    keys: KeySpace
    fair_pools: frozenset[str]
    _group_inflight: str
    _promote: LuaScript
    _tenant_promote: LuaScript
    _bury: LuaScript
    _tenant_bury: LuaScript
    fair_picks: dict[str, dict[bytes, FairPick]]
    _renew: LuaScript
    _relet: LuaScript
    _lease_records: str
    _poll: str

    async def take_poll(self, interval_s: float) -> bool:
        """True when this dispatcher's idle poll is the group's next one (one SET NX per attempt)."""
        # On the pipelined connection, like every hot-path step: redis-py's own command costs more CPU
        # than the rest of an idle dispatcher's second.
        [taken] = await run_pipeline(
            self.client, [], lambda pipe: pipe.set_nx(self._poll, b"1", max(1, int(interval_s * 1000)))
        )
        return taken is not None

    async def promote(self, pool_ids: Sequence[str]) -> int:
        """Moves due retries of ``pool_ids`` back to the head of their lists; how many moved."""
        if not pool_ids:
            return 0

        def build(pipe: Any) -> None:
            for pool_id in pool_ids:
                if pool_id in self.fair_pools:  # back onto each retry's tenant's list
                    self._tenant_promote.queue(pipe, *promote_call(self.keys, pool_id))
                    continue
                self._promote.queue(pipe, *promote_args(self.keys, pool_id))

        scripts_used = [self._promote, self._tenant_promote]
        return sum(int(n) for n in await run_pipeline(self.client, scripts_used, build))

    async def bury(
        self, raw: bytes, *, pool_id: str, producer_id: str, letter: bytes, reply: bytes, reply_ttl_s: float
    ) -> bool:
        """Dead-letters the head ``raw`` of a pool as ``letter`` and answers its producer with ``reply``
        if it is alive; False if the head moved."""

        script_keys, args = bury_args(
            self.keys, raw, pool_id=pool_id, producer_id=producer_id, letter=letter, reply=reply,
            reply_ttl_s=reply_ttl_s,
        )  # fmt: skip
        pick = self.fair_picks.get(pool_id, {}).get(raw)
        bury = self._bury
        if pick is not None:  # a fair pool's head: taken from its tenant's list (issue 22)
            script_keys, args = bury_fair_args(self.keys, pool_id, pick, script_keys, args)
            bury = self._tenant_bury

        def build(pipe: Any) -> None:
            bury.queue(pipe, script_keys, args)

        [buried] = await run_pipeline(self.client, [bury], build)
        return bool(int(buried))

    async def renew(self, leases: Sequence[tuple[str, str, str]], lease_s: float) -> None:
        """Extends the leases (pool id, member, backend id) this dispatcher still holds."""
        if not leases:
            return

        def build(pipe: Any) -> None:
            for pool_id, member, backend_id in leases:
                zsets = [
                    self._group_inflight,
                    self.keys.pool_inflight(pool_id),
                    self.keys.backend_inflight(backend_id),
                ]
                self._renew.queue(pipe, zsets, [lease_s, member])

        await run_pipeline(self.client, [self._renew], build)

    async def relet(self, leases: Sequence[tuple[str, str, str, bytes]], lease_s: float) -> None:
        """Gives back the leases (pool id, member, backend id, record) REAP took from this dispatcher
        while it still runs their calls (lists mode; see ``lua/relet.lua``)."""
        if not leases:
            return

        def build(pipe: Any) -> None:
            for pool_id, member, backend_id, record in leases:
                zsets = [
                    self._group_inflight,
                    self.keys.pool_inflight(pool_id),
                    self.keys.backend_inflight(backend_id),
                ]
                self._relet.queue(pipe, [*zsets, self._lease_records], [lease_s, member, record])

        await run_pipeline(self.client, [self._relet], build)
