"""Reads of the live fabric state: dispatcher snapshots and counters in Valkey, merged into one view.

Each ``*_read`` takes a client (see :func:`pools.connections.valkey_client`) and raises Valkey errors;
:func:`fabric_view` is the one place that turns them into a view saying Valkey is unreachable. The
merge itself is :mod:`dashboard.merge`; the words for reasons are :mod:`dashboard.reasons`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from typing import Any, TypedDict

import orjson
import redis
from django.urls import reverse

from dashboard.merge import (
    ConfiguredPool,
    FabricView,
    PoolTenants,
    TenantRow,
    counter_totals,
    finish_view,
    merge_snapshots,
    rejections_by_pool,
)
from dashboard.tenant_window import ServedWindow
from pools import selectors as pool_selectors
from pools.connections import VALKEY_ERRORS, key_space, valkey_client
from pools.restore import restored_read
from runtime.backends.status import READS, queue_reads, status_from_replies
from runtime.dispatch import deadletters
from runtime.dispatch.snapshot import DispatcherSnapshot
from runtime.errors import DispatchError
from runtime.queue.keys import UNTAGGED
from runtime.queue.leases import LeaseRecord
from runtime.wire.backendconfig import BackendConfig
from runtime.wire.groupconfig import GroupConfig

log = logging.getLogger(__name__)

_SCAN_COUNT = 200
TENANT_ROWS = 10  # tenants shown per fair pool, by queued work
# The backlogged tenants (highest virtual counters first) whose lists are measured, and the leases of a
# pool read for in-flight counts: bounds on a pool of 100,000 sub-tenants. Below them the top is exact.
TENANT_CANDIDATES = 256
TENANT_LEASES = 1024
SERVED_WINDOW = ServedWindow()  # this web process's earlier reads of the served hashes


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
            "tenant_fairness": p.tenant_fairness,
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


def _in_flight_by_tenant(pool_id: str, records: list[bytes | None]) -> Counter[str]:
    found: Counter[str] = Counter()
    for raw in records:
        record = LeaseRecord.decode(raw) if raw else None
        if record is not None and record.pool_id == pool_id:
            found[UNTAGGED if record.tenant is None else record.tenant] += 1
    return found


def tenants_read(
    *, group_id: str, fairness: dict[str, str], now: float, client: redis.Redis | None = None
) -> dict[str, PoolTenants]:
    """The top :data:`TENANT_ROWS` tenants of each fair pool (``fairness``: pool -> mode) by queued
    requests, with their leases in flight, virtual counter and cost served (cumulative and in about the
    last minute, see :class:`ServedWindow`). Three pipelined round trips, each bounded per pool by
    :data:`TENANT_CANDIDATES` and :data:`TENANT_LEASES`. Raises redis errors."""
    if not fairness:
        return {}
    client, keys, pool_ids = valkey_client(client), key_space(), list(fairness)
    pipe = client.pipeline(transaction=False)
    for pool_id in pool_ids:
        pipe.zrevrange(keys.tenants(pool_id), 0, TENANT_CANDIDATES - 1, withscores=True)
        pipe.zcard(keys.tenants(pool_id))
        pipe.zrange(keys.pool_inflight(pool_id), 0, TENANT_LEASES - 1)
    first = pipe.execute()
    pipe = client.pipeline(transaction=False)
    for i in range(len(pool_ids)):
        pipe.hmget(keys.lease_records(group_id), first[3 * i + 2] or [b""])  # HMGET needs a field
    records = pipe.execute()
    pipe = client.pipeline(transaction=False)
    plans = []
    for i, pool_id in enumerate(pool_ids):
        counters = {m.decode(): float(score) for m, score in first[3 * i]}
        flying = _in_flight_by_tenant(pool_id, records[i])
        names = sorted(set(counters) | set(flying))
        plans.append((counters, flying, names))
        for name in names:
            pipe.llen(keys.tenant_requests(pool_id, name))
        pipe.hmget(keys.tenant_served(pool_id), names or [""])
        pipe.hmget(keys.tenant_counters(pool_id), names or [""])
    replies, at, result = pipe.execute(), 0, {}
    for i, pool_id in enumerate(pool_ids):
        counters, flying, names = plans[i]
        part, at = replies[at : at + len(names) + 2], at + len(names) + 2
        rows = _tenant_rows(pool_id, now, names, part, counters, flying)
        result[pool_id] = PoolTenants(
            pool_id=pool_id, fairness=fairness[pool_id], backlogged=int(first[3 * i + 1]), rows=rows
        )
    return result


def _tenant_rows(
    pool_id: str, now: float, names: list[str], replies: list[Any], counters: dict[str, float],
    flying: Counter[str],
) -> list[TenantRow]:  # fmt: skip
    """The top rows from the candidates' LLENs, then their served and counter HMGETs."""
    lengths, served_raw, counter_raw = replies[: len(names)], replies[-2], replies[-1]
    served = {n: float(v or 0) for n, v in zip(names, served_raw, strict=False)}
    per_minute = SERVED_WINDOW.per_minute(pool_id, now, served)
    rows = [
        TenantRow(
            tenant=name,
            queued=int(lengths[j]),
            in_flight=flying[name],
            # a tenant in flight but not backlogged is out of the zset; its counter stays in the hash
            counter=counters.get(name, None if counter_raw[j] is None else float(counter_raw[j])),
            served=served[name],
            served_last_minute=per_minute[name],
        )
        for j, name in enumerate(names)
    ]
    rows.sort(key=lambda r: (-r["queued"], -r["in_flight"], -r["served"], r["tenant"]))
    return rows[:TENANT_ROWS]


def fair_pools(configured: list[ConfiguredPool]) -> dict[str, str]:
    """Pool -> tenant fairness mode of the configured pools that have it on."""
    modes = {p["pool_id"]: p.get("tenant_fairness", "off") for p in configured}
    return {pool_id: mode for pool_id, mode in modes.items() if mode != "off"}


class FabricRead(TypedDict):
    snapshots: list[DispatcherSnapshot]
    lengths: dict[str, int]
    totals: dict[str, Any]  # with each pool's dead letters under ``dead_letters``
    backends: list[dict[str, Any]]
    rejections: dict[str, dict[str, int]]


def fabric_read(
    *, group_id: str, pool_ids: list[str], now: float | None = None, fairness: dict[str, str] | None = None
) -> FabricRead:
    """Snapshots, live queue lengths of ``pool_ids``, the counter totals (with each pool's dead
    letters under ``dead_letters`` and the top tenants of the pools ``fairness`` names as fair under
    ``tenants``), the backends' live status and the rejections, with one client.

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
    totals["tenants"] = tenants_read(
        group_id=group_id, fairness={p: f for p, f in (fairness or {}).items() if f != "off"}, now=now,
        client=client,
    )  # fmt: skip
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
        read = fabric_read(
            group_id=group_id, pool_ids=[p["pool_id"] for p in configured], now=now,
            fairness=fair_pools(configured),
        )  # fmt: skip
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
