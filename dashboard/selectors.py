"""Reads of the live fabric state: dispatcher snapshots and counters in Valkey, merged into one view.

Each ``*_read`` takes a client (see :func:`pools.connections.valkey_client`) and raises Valkey errors;
:func:`fabric_view` is the one place that turns them into a view saying Valkey is unreachable. The
merge itself is :mod:`dashboard.merge`; the words for reasons are :mod:`dashboard.reasons`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, TypedDict

import orjson
import redis
from django.urls import reverse

from dashboard.merge import (
    ConfiguredPool,
    FabricView,
    counter_totals,
    finish_view,
    merge_snapshots,
    rejections_by_pool,
)
from pools import selectors as pool_selectors
from pools.connections import VALKEY_ERRORS, key_space, valkey_client
from pools.restore import restored_read
from runtime.backends.status import READS, queue_reads, status_from_replies
from runtime.dispatch import deadletters
from runtime.dispatch.snapshot import DispatcherSnapshot
from runtime.errors import DispatchError
from runtime.wire.backendconfig import BackendConfig
from runtime.wire.groupconfig import GroupConfig

log = logging.getLogger(__name__)

_SCAN_COUNT = 200


def snapshots_read(*, group_id: str, client: redis.Redis | None = None) -> list[DispatcherSnapshot]:
    """The latest snapshot of every live dispatcher of the group (SCAN of the snapshot keys + MGET)."""
    client = valkey_client(client)
    names = list(client.scan_iter(match=key_space().snapshot_pattern(group_id), count=_SCAN_COUNT))
    raws = client.mget(names) if names else []
    snapshots: list[DispatcherSnapshot] = []
    for raw in raws:
        if not raw:
            continue  # expired between SCAN and MGET
        try:
            snapshots.append(orjson.loads(raw))
        except orjson.JSONDecodeError:
            log.warning("ignoring an undecodable dispatcher snapshot of group %s", group_id)
    return snapshots


def counters_read(*, group_id: str, client: redis.Redis | None = None) -> dict[str, Any]:
    return counter_totals(valkey_client(client).hgetall(key_space().counters(group_id)))


def backends_read(
    *, group_id: str, now: float, client: redis.Redis | None = None
) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """The live status of the group's backends (as published with the group) and the rejections per
    pool and reason. Raises redis errors (see VALKEY_ERRORS)."""
    client, keys = valkey_client(client), key_space()
    raw_config = client.get(keys.group_config(group_id))
    backends: tuple[BackendConfig, ...] = ()
    if raw_config:
        try:
            backends = GroupConfig.decode(raw_config).backends
        except DispatchError:
            log.warning("dashboard: the published configuration of group %s is unreadable", group_id)
    pipe = client.pipeline(transaction=False)
    for backend in backends:
        queue_reads(pipe, keys, backend.backend_id, now)
    pipe.hgetall(keys.rejections())
    replies = pipe.execute()
    statuses = []
    for i, backend in enumerate(backends):
        status = status_from_replies(backend, replies[READS * i : READS * i + READS], now)
        statuses.append(
            {
                **dataclasses.asdict(status),
                "breaker_words": status.breaker_words,
                "metrics_words": status.metrics_words(),
                "held_words": status.hold_words().strip(" ()"),
            }
        )
    return statuses, rejections_by_pool(replies[-1])


def configured_pools(*, group_id: str) -> list[ConfiguredPool]:
    """The group's pools as configured in the database, with their admin and history links.

    Raises FabricGroup.DoesNotExist.
    """
    group = pool_selectors.group_get(group_id=group_id)
    return [
        {
            "pool_id": p.pool_id,
            "display_name": p.display_name or p.pool_id,
            "weight": p.quantum,
            "min_concurrent": p.min_concurrent,
            "max_concurrent": p.max_concurrent,
            "max_burst_per_visit": p.max_burst_per_visit,
            "enabled": p.enabled,
            "paused": p.paused,
            "max_queued": p.max_queued,
            "admin_url": reverse("admin:pools_pool_change", args=[p.pk]),
            "dead_letters_url": reverse("admin:pools_pool_dead_letters", args=[p.pk]),
        }
        for p in pool_selectors.group_pools(group=group)
    ]


def config_restored_read(*, client: redis.Redis) -> dict[str, Any] | None:
    """When the configuration was last republished to a Valkey that had lost it, and by whom."""
    restored = restored_read(client=client)
    if restored is None:
        return None
    at_text = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(restored.at))
    return {"at": restored.at, "at_text": at_text, "by": restored.by, "groups": restored.groups}


class FabricRead(TypedDict):
    snapshots: list[DispatcherSnapshot]
    lengths: dict[str, int]
    totals: dict[str, Any]  # with each pool's dead letters under ``dead_letters``
    backends: list[dict[str, Any]]
    rejections: dict[str, dict[str, int]]


def fabric_read(*, group_id: str, pool_ids: list[str], now: float | None = None) -> FabricRead:
    """Snapshots, live queue lengths of ``pool_ids``, the counter totals (with each pool's dead
    letters under ``dead_letters``), the backends' live status and the rejections, with one client.

    Raises redis errors (see VALKEY_ERRORS).
    """
    now = time.time() if now is None else now
    client = valkey_client()
    snapshots = snapshots_read(group_id=group_id, client=client)
    lengths = pool_selectors.queue_lengths_read(pool_ids=pool_ids, client=client)
    totals = counters_read(group_id=group_id, client=client)
    totals["dead_letters"] = {
        summary.pool_id: {"count": summary.count, "oldest_dead_at": summary.oldest_dead_at}
        for summary in deadletters.summaries(client, key_space(), pool_ids)
    }
    backends, rejections = backends_read(group_id=group_id, client=client, now=now)
    totals["config_restored"] = config_restored_read(client=client)
    return FabricRead(
        snapshots=snapshots, lengths=lengths, totals=totals, backends=backends, rejections=rejections
    )


def fabric_view(
    *, group_id: str, configured: list[ConfiguredPool] | None = None, now: float | None = None
) -> FabricView:
    """The merged live view of a group, plus cumulative counters and unobserved configured pools.

    Never raises for Valkey trouble: the view then carries ``valkey_error`` and no dispatchers.
    """
    now = time.time() if now is None else now
    configured = configured or []
    error = ""
    try:
        read = fabric_read(group_id=group_id, pool_ids=[p["pool_id"] for p in configured], now=now)
    except VALKEY_ERRORS as exc:
        log.warning("dashboard cannot read Valkey: %s", exc)
        error = str(exc)
        read = FabricRead(snapshots=[], lengths={}, totals=counter_totals({}), backends=[], rejections={})
    view = merge_snapshots(read["snapshots"], now=now)
    view["valkey_error"] = error
    return finish_view(
        view, group_id=group_id, configured=configured, queue_lengths=read["lengths"], totals=read["totals"],
        backends=read["backends"], rejections=read["rejections"], now=now,
    )  # fmt: skip
