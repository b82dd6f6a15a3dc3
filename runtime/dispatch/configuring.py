"""The dispatcher's configuration: the group's published configuration read, checked and applied.

A configuration arrives on the group's config channel or by the dispatcher's poll; one the scheduler
would refuse (:func:`runtime.policy.scheduler.validate_policy`) or that does not decode is refused
visibly (logged, counted once per value, shown in the snapshot) and the one in force is kept.

:class:`Configuring` is a part of :class:`~runtime.dispatch.dispatcher.Dispatcher`, kept in a module
of its own; the attributes it reads are declared here and set by the dispatcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import redis.asyncio as aioredis

from runtime.backends.fleet import BackendFleet
from runtime.config import DispatcherSettings
from runtime.dispatch.stats import DispatcherStats
from runtime.errors import DispatchError
from runtime.policy import scheduler
from runtime.queue.keys import KeySpace
from runtime.telemetry.spans import Identity
from runtime.valkey.client import REDIS_ERRORS
from runtime.wire.groupconfig import GroupConfig

__all__ = ["Configuring"]

# The dispatcher's own logger, as before this part had a module of its own: logs are filtered by it.
log = logging.getLogger("runtime.dispatch.dispatcher")


class Configuring:
    """The configuration's half of the dispatcher (see the module doc)."""

    client: aioredis.Redis
    keys: KeySpace
    settings: DispatcherSettings
    config: GroupConfig | None
    fleet: BackendFleet
    stats: DispatcherStats
    identity: Identity
    _policy: scheduler.GroupPolicy | None
    _state: scheduler.SchedulerState
    _rejected_config: bytes | str | None
    _stopping: asyncio.Event
    _wake: asyncio.Event

    async def _wait_for_config(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(*REDIS_ERRORS):
                if await self._reload_config():
                    return
            log.warning("no configuration published for fabric group %r yet; waiting", self.settings.group_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 1.0)

    async def _reload_config(self) -> bool:
        """Applies the published configuration if it changed; True once a configuration is in force."""
        raw = await self.client.get(self.keys.group_config(self.settings.group_id))
        if raw:
            self._consider_config(raw)
        return self.config is not None

    def _consider_config(self, raw: bytes | str) -> None:
        """Applies a published configuration, or refuses it visibly (logged, counted, in the snapshot)."""
        try:
            config = GroupConfig.decode(raw)
            if self.config is None or config.version != self.config.version or config != self.config:
                if problems := scheduler.validate_policy(config.scheduler_policy()):
                    raise ValueError("; ".join(problems))
                self.apply_config(config)
        except (DispatchError, ValueError, TypeError) as exc:
            if raw != self._rejected_config:  # polled again and again: count each refused value once
                self._rejected_config = raw
                self.stats.config_rejected += 1
                log.error(
                    "dispatcher %s refused a configuration of fabric group %s and keeps version %s: %s",
                    self.identity.dispatcher_id,
                    self.settings.group_id,
                    self.config.version if self.config else None,
                    exc,
                )

    def apply_config(self, config: GroupConfig) -> None:
        """Swaps in a new configuration; in-flight calls are untouched, credit of kept pools is kept."""
        previous = {p.pool_id for p in self._policy.pools} if self._policy else set()
        self.config = config
        self._policy = config.scheduler_policy()
        self.fleet.configure(config.backends)
        for gone in previous - {p.pool_id for p in self._policy.pools}:
            self._state.forget(gone)
        self._wake.set()
        log.info(
            "fabric group %s configuration version %s: %d pools, policy %s, total %d",
            config.group_id,
            config.version,
            len(self._policy.pools),
            config.policy,
            config.total_concurrency,
        )
