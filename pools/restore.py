"""The database is the source of truth: a Valkey that lost the configuration gets it back from here.

A Valkey restarted empty (no persistence, a lost disk) or a replica promoted before it had the latest
writes has no published group configurations and no pool registry. Dispatchers keep running on what
they hold in memory, but a producer that reads nothing there can no longer check admission limits or
unknown pools. :func:`configuration_missing` notices it in one round trip; :func:`configuration_restore`
republishes every group and records when and by whom, for the dashboard.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis

from pools import selectors, services
from pools.connections import VALKEY_ERRORS, key_space, sync_client

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Restored:
    """The last republication to a Valkey that had lost the configuration."""

    at: float
    by: str
    groups: int


def configuration_missing(*, client: redis.Redis, group_id: str) -> bool:
    """True when Valkey lacks what the database says it should hold: the pool registry while some pool
    is enabled, or ``group_id``'s configuration while the group exists (a deleted group is meant to be
    missing)."""
    keys = key_space()
    with client.pipeline(transaction=False) as pipe:
        pipe.exists(keys.pool_registry())
        pipe.exists(keys.group_config(group_id))
        registry, config = pipe.execute()
    if registry and config:
        return False
    if not config and selectors.group_exists(group_id=group_id):
        return True
    return not registry and selectors.enabled_pool_exists()


def configuration_restore(*, by: str) -> list[services.PublishResult]:
    """Republishes every group from the database; records when and by whom (``config_restored``)."""
    results = services.group_publish_all(prune=False)
    published = [r for r in results if r.ok]
    if published:
        try:
            sync_client().hset(
                key_space().config_restored(),
                mapping={"at": repr(time.time()), "by": by, "groups": len(published)},
            )
        except VALKEY_ERRORS as exc:
            log.warning("republished the configuration but could not record it: %s", exc)
    failed = [f"{r.group_id}: {r.error}" for r in results if not r.ok]
    log.warning(
        "Valkey had lost the published configuration: %s republished %s group(s) from the database%s",
        by,
        len(published),
        f"; not republished: {'; '.join(failed)}" if failed else "",
    )
    return results


def restored_read(*, client: redis.Redis) -> Restored | None:
    """The last restoration, None if Valkey never lost the configuration (or lost this record too)."""
    raw = client.hgetall(key_space().config_restored())
    try:
        return Restored(at=float(raw[b"at"]), by=raw[b"by"].decode(), groups=int(raw[b"groups"]))
    except (KeyError, ValueError):
        return None
