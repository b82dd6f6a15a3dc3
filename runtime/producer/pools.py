"""The producer's view of the pool registry: which group serves each pool, and that group's config.

Read with one script (``lua/read_registry.lua``) every ``pool_registry_refresh_s`` and whenever a
submit names a pool the last read did not know; concurrent submits that find it stale share one read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from runtime.errors import MalformedEnvelope, QueueUnavailable, UnknownPool
from runtime.policy.admission import AdmissionLimits
from runtime.producer.outcomes import ProducerStats
from runtime.queue import registry
from runtime.queue.keys import KeySpace
from runtime.valkey.client import REDIS_ERRORS
from runtime.wire.groupconfig import GroupConfig, ModelAlias

__all__ = ["PoolRegistry", "RegistryView"]

log = logging.getLogger(__name__)

_UNBOUNDED = AdmissionLimits()


@dataclass(slots=True)
class RegistryView:
    """Which group each enabled pool belongs to, and each group's published configuration."""

    pools: dict[str, str] = field(default_factory=dict)
    groups: dict[str, GroupConfig] = field(default_factory=dict)
    read_at: float = float("-inf")
    # Each pool's admission limits, worked out once per read instead of once per submit.
    limits: dict[str, AdmissionLimits] = field(default_factory=dict)
    # Every group's model aliases of its enabled pools, by alias (names are unique over the fleet).
    aliases: dict[str, ModelAlias] = field(default_factory=dict)
    # Where it came from: "published" (as read), "last_known" (Valkey lost some or all of it and this
    # is what the producer read before), "none" (nothing was ever read: the checks are skipped).
    source: str = "none"


class PoolRegistry:
    """The registry as last read, read again when stale (one read at a time)."""

    def __init__(
        self,
        client: aioredis.Redis,
        keys: KeySpace,
        refresh_s: float,
        stats: ProducerStats,
        owner: str = "producer",
    ) -> None:
        self.keys = keys
        self.refresh_s = refresh_s
        self.stats = stats  # counts the reads that found the published configuration missing
        self.owner = owner  # who reads it, for the log
        self.view = RegistryView()
        self._script = registry.script("read_registry").bind(client)
        self._reading: asyncio.Future[RegistryView] | None = None

    def __repr__(self) -> str:
        return f"<PoolRegistry pools={len(self.view.pools)} groups={len(self.view.groups)}>"

    def group_of(self, pool_id: str) -> str | None:
        """The group of ``pool_id`` as last read (no read: for counters and spans)."""
        return self.view.pools.get(pool_id)

    def limits(self, pool_id: str) -> AdmissionLimits:
        """The pool's limits as last published (read with the pool registry, every few seconds)."""
        return self.view.limits.get(pool_id, _UNBOUNDED)

    async def pool_group(self, pool_id: str) -> GroupConfig | None:
        """The published configuration of the group serving ``pool_id``; UnknownPool if no group has it.

        None while nothing is published (the check is then skipped).
        """
        view = self.view
        if time.monotonic() - view.read_at > self.refresh_s or (view.pools and pool_id not in view.pools):
            view = await self.fresh()
        if view.pools and pool_id not in view.pools:
            known = ", ".join(sorted(view.pools))
            raise UnknownPool(f"no fabric group has an enabled pool {pool_id!r} (known pools: {known})")
        return view.groups.get(view.pools.get(pool_id, ""))

    async def aliases(self) -> dict[str, ModelAlias]:
        """The published model aliases of enabled pools, read again when stale."""
        view = self.view
        if time.monotonic() - view.read_at > self.refresh_s:
            view = await self.fresh()
        return view.aliases

    async def fresh(self) -> RegistryView:
        """The registry read again, one read at a time: every submit that finds it stale joins the read
        in flight. (Each used to start its own: with 2,000 calls in flight, a burst of 2,000 HGETALL and
        MGET round trips every refresh interval, a sixth of the producer's CPU.)

        The first caller reads in its own task (no extra task per read); the others wait for its result
        or its error.
        """
        while (pending := self._reading) is not None:
            try:
                # Shielded: a waiter cancelled meanwhile leaves the read to the others.
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not pending.cancelled() or (task is not None and task.cancelling()):
                    raise  # this caller was cancelled, not the reader
                # The reader was cancelled: read again, this caller first.
        read: asyncio.Future[RegistryView] = asyncio.get_running_loop().create_future()
        self._reading = read
        try:
            view = await self._read()
        except Exception as exc:
            read.set_exception(exc)
            read.exception()  # retrieved: nobody may be waiting
            raise
        except BaseException:
            read.cancel()
            raise
        finally:
            self._reading = None
        read.set_result(view)
        return view

    async def _read(self) -> RegistryView:
        try:
            flat, group_ids, configs = await self._script(
                keys=[self.keys.pool_registry()], args=[self.keys.group_config("")]
            )
            pools = {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)}
            group_ids = [_text(g) for g in group_ids]
        except REDIS_ERRORS as exc:
            raise QueueUnavailable(f"could not read the pool registry: {exc}") from exc
        groups = {}
        for group_id, config in zip(group_ids, configs, strict=True):
            with contextlib.suppress(MalformedEnvelope):
                if config:
                    groups[group_id] = GroupConfig.decode(config)
        pools, groups, source = self._with_last_known(pools, groups)
        limits = {}
        for pool_id, group_id in pools.items():
            pool = groups[group_id].pool(pool_id) if group_id in groups else None
            if pool is not None:
                limits[pool_id] = pool.admission_limits(groups[group_id].backend_for(pool_id))
        aliases = {
            alias.alias: alias
            for group_id, group in sorted(groups.items())
            for alias in group.aliases
            if pools.get(alias.pool_id) == group_id
        }
        self.view = RegistryView(
            pools=pools, groups=groups, read_at=time.monotonic(), limits=limits, source=source,
            aliases=aliases,
        )  # fmt: skip
        return self.view

    def _with_last_known(
        self, pools: dict[str, str], groups: dict[str, GroupConfig]
    ) -> tuple[dict[str, str], dict[str, GroupConfig], str]:
        """What was read, with what Valkey lost filled in from the last read: a Valkey restarted empty
        must not switch admission limits and the unknown-pool check off until the configuration is
        republished (dispatchers do so from the database within seconds)."""
        previous = self.view
        if not previous.pools:
            return pools, groups, "published" if pools else "none"
        if not pools:
            pools, groups = previous.pools, previous.groups
        lost = {g for g in pools.values() if g not in groups and g in previous.groups}
        if not lost and pools is not previous.pools:
            if previous.source == "last_known":
                log.warning("%s: the published configuration is back", self.owner)
            return pools, groups, "published"
        groups = {**groups, **{g: previous.groups[g] for g in lost}}
        self.stats.config_missing_reads += 1
        if previous.source != "last_known":
            log.warning(
                "%s: Valkey has lost the published configuration; submits are checked against the last "
                "known one until it is republished",
                self.owner,
            )
        return pools, groups, "last_known"


def _text(value: bytes | str) -> str:
    """The client returns bytes (no ``decode_responses``); accept str for clients configured otherwise."""
    return value.decode() if isinstance(value, bytes) else value
