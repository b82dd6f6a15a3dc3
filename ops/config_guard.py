"""A dispatcher process keeps Valkey's copy of the configuration: it republishes it from the database
when Valkey comes back without it (restarted empty, a replica promoted with lag).

The check is one pipelined EXISTS of the pool registry and the group's configuration per interval; the
republication (every group, :func:`pools.restore.configuration_restore`) runs in a worker thread, as
the ORM is synchronous, so the dispatcher's loop never waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from django.db import close_old_connections

from pools.connections import VALKEY_ERRORS, sync_client
from pools.restore import configuration_missing, configuration_restore

log = logging.getLogger("ops.rundispatcher")

CHECK_INTERVAL_S = 1.0  # how soon a Valkey that lost the configuration has it back (plus one publish)


class ConfigGuard:
    """Checks every ``interval_s`` that Valkey holds the configuration; republishes it when it does not."""

    def __init__(self, group_id: str, *, by: str, interval_s: float = CHECK_INTERVAL_S) -> None:
        self.group_id = group_id
        self.by = by
        self.interval_s = interval_s
        self.restorations = 0

    def __repr__(self) -> str:
        return f"<ConfigGuard {self.group_id} every {self.interval_s:g}s restorations={self.restorations}>"

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop`` is set; never raises (an unreachable Valkey is the dispatcher's to report)."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
            if stop.is_set():
                return
            try:
                await asyncio.to_thread(self.check)
            except VALKEY_ERRORS as exc:
                log.debug("configuration check skipped, Valkey unreachable: %s", exc)
            except Exception:
                log.exception("configuration check failed")

    def check(self) -> bool:
        """One check (and republication when needed); True when it republished."""
        close_old_connections()  # this worker thread's database connection may have gone stale
        try:
            if not configuration_missing(client=sync_client(), group_id=self.group_id):
                return False
            configuration_restore(by=self.by)
            self.restorations += 1
            return True
        finally:
            close_old_connections()
