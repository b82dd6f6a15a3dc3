"""Reads of fabric groups and pools; admin, commands and views call these instead of the ORM."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Iterable

import redis
from asgiref.sync import async_to_sync
from django.db.models import QuerySet

from pools.connections import VALKEY_ERRORS, key_space, sync_client, valkey_client
from pools.models import Backend, FabricGroup, Pool
from runtime.backends.probe import ProbeResult, probe
from runtime.backends.status import READS, BackendStatus, queue_reads, status_from_replies
from runtime.dispatch import deadletters
from runtime.wire.backendconfig import BackendConfig
from runtime.wire.groupconfig import GroupConfig, ModelAlias, PoolConfig

log = logging.getLogger(__name__)


def group_get(*, group_id: str) -> FabricGroup:
    """The group; raises FabricGroup.DoesNotExist."""
    return FabricGroup.objects.get(group_id=group_id)


def group_exists(*, group_id: str) -> bool:
    return FabricGroup.objects.filter(group_id=group_id).exists()


def enabled_pool_exists() -> bool:
    """True when some group has an enabled pool (so the pool registry should not be empty)."""
    return Pool.objects.filter(enabled=True).exists()


def group_list() -> QuerySet[FabricGroup]:
    return FabricGroup.objects.order_by("group_id")


def group_pools(*, group: FabricGroup) -> QuerySet[Pool]:
    """The group's pools in ring order (sort order, then id)."""
    return Pool.objects.filter(group=group).order_by("sort_order", "pool_id")


def pool_get(*, pool_id: str) -> Pool:
    """The pool; raises Pool.DoesNotExist."""
    return Pool.objects.select_related("group").get(pool_id=pool_id)


def pool_list(*, group: FabricGroup | None = None) -> QuerySet[Pool]:
    pools = Pool.objects.select_related("group")
    return pools.filter(group=group) if group is not None else pools


def backend_list() -> QuerySet[Backend]:
    return Backend.objects.order_by("backend_id")


def backend_get(*, backend_id: str) -> Backend:
    """The backend; raises Backend.DoesNotExist."""
    return Backend.objects.get(backend_id=backend_id)


def backend_group_ids(*, backend: Backend) -> set[str]:
    """The groups whose publication carries this backend (as their default or a pool's)."""
    return set(FabricGroup.objects.filter(backend=backend).values_list("group_id", flat=True)) | set(
        Pool.objects.filter(backend=backend).values_list("group_id", flat=True)
    )


def backend_config(*, backend: Backend) -> BackendConfig:
    """The published form of a backend row: the config's fields are the model's, by name."""
    return BackendConfig(**{f.name: getattr(backend, f.name) for f in dataclasses.fields(BackendConfig)})


def backend_test_connection(*, backend: Backend) -> ProbeResult:
    """One look at the backend over real HTTP, as saved: its models (with the key the dispatchers would
    send, read from this process's environment, as ``rundispatcher`` reads it) and its load (as the
    scraper reads it). Bounded in time and size; never raises for anything the backend does."""
    config = backend_config(backend=backend)
    api_key = os.environ.get(config.api_key_env) if config.api_key_env else None
    return async_to_sync(probe)(config, api_key=api_key or None)


def backend_live(*, backends: Iterable[Backend]) -> dict[str, BackendStatus]:
    """Each backend's live status (shared load, breaker, our in-flight calls) from Valkey in one
    round trip; empty when Valkey cannot be reached."""
    configs = [backend_config(backend=b) for b in backends]
    if not configs:
        return {}
    now = time.time()
    try:
        with sync_client().pipeline(transaction=False) as pipe:
            for config in configs:
                queue_reads(pipe, key_space(), config.backend_id, now)
            replies = pipe.execute()
    except VALKEY_ERRORS as exc:
        log.warning("could not read the backends' live load: %s", exc)
        return {}
    return {
        c.backend_id: status_from_replies(c, replies[READS * i : READS * i + READS], now)
        for i, c in enumerate(configs)
    }


def group_config(*, group: FabricGroup, version: int = 0) -> GroupConfig:
    """The configuration dispatchers of the group run with, as published to Valkey.

    Each pool's ``endpoint_url`` is resolved from its backend (else the group's), and the group's
    ``default_endpoint_url`` / ``api_key_env`` from its backend, as the seed published them.
    """
    rows = list(group_pools(group=group).select_related("backend"))
    used = {b.backend_id: b for b in [group.backend, *(p.backend for p in rows)] if b is not None}
    default_url = group.backend.base_url if group.backend else ""
    pools = tuple(
        PoolConfig(
            pool_id=p.pool_id,
            quantum=p.quantum,
            max_concurrent=p.max_concurrent,
            min_concurrent=p.min_concurrent,
            max_burst_per_visit=p.max_burst_per_visit,
            display_name=p.display_name,
            endpoint_url=p.backend.base_url if p.backend else default_url,
            enabled=p.enabled,
            paused=p.paused,
            max_attempts=p.max_attempts,
            retry_backoff_base_s=p.retry_backoff_base_s,
            retry_backoff_cap_s=p.retry_backoff_cap_s,
            max_requeues=p.max_requeues,
            backend_id=p.backend_id or "",
            max_queued=p.max_queued,
            max_queue_wait_s=p.max_queue_wait_s,
            tenant_fairness=p.tenant_fairness,
            tenant_input_weight=p.tenant_input_weight,
            tenant_output_weight=p.tenant_output_weight,
            tenant_default_output_tokens=p.tenant_default_output_tokens,
            max_queued_per_tenant=p.max_queued_per_tenant,
        )
        for p in rows
    )
    return GroupConfig(
        group_id=group.group_id,
        policy=group.policy,
        total_concurrency=group.total_concurrency,
        default_endpoint_url=default_url,
        api_key_env=group.backend.api_key_env if group.backend else "",
        queueing_enabled=group.queueing_enabled,
        delivery=group.delivery,
        persist_replicas=group.persist_replicas,
        name=group.name,
        pools=pools,
        version=version,
        backend_id=group.backend_id or "",
        backends=tuple(backend_config(backend=b) for _, b in sorted(used.items())),
        cost_mode=group.cost_mode,
        aliases=tuple(
            ModelAlias(alias=a.alias, pool_id=a.pool.pool_id, model=a.sent_model)
            for a in group.aliases.select_related("pool").order_by("alias")
        ),
    )


def group_published_config(*, group_id: str) -> GroupConfig | None:
    """What Valkey currently holds for the group; None when nothing is published.

    Raises one of ``pools.connections.VALKEY_ERRORS`` when Valkey cannot be reached.
    """
    raw = sync_client().get(key_space().group_config(group_id))
    return GroupConfig.decode(raw) if raw else None


def queue_lengths_read(*, pool_ids: list[str], client: redis.Redis | None = None) -> dict[str, int]:
    """Pending requests per pool (LLEN of each lane, or a fair pool's queued count across its tenants'
    lists, which only a pool with tenant fairness keeps) in one round trip; raises VALKEY_ERRORS."""
    if not pool_ids:
        return {}
    keys = key_space()
    pipe = valkey_client(client).pipeline(transaction=False)
    for pool_id in pool_ids:
        pipe.llen(keys.requests(pool_id))
        pipe.get(keys.pool_queued(pool_id))
    read = pipe.execute()
    return {pool_id: max(int(read[2 * i]), int(read[2 * i + 1] or 0)) for i, pool_id in enumerate(pool_ids)}


def pool_queue_lengths(*, pool_ids: list[str]) -> dict[str, int]:
    """Pending requests per pool (LLEN of each lane); empty when Valkey cannot be reached."""
    try:
        return queue_lengths_read(pool_ids=pool_ids)
    except VALKEY_ERRORS as exc:
        log.warning("could not read queue lengths from Valkey: %s", exc)
        return {}


def pool_dead_letters(*, pool: Pool, limit: int = 200) -> list[deadletters.StoredLetter]:
    """The pool's oldest dead letters as stored in Valkey (raises a VALKEY_ERRORS member when down)."""
    return deadletters.dead_letters(sync_client(), key_space(), pool.pool_id, limit=limit)


def pool_dead_letter_counts(*, pool_ids: list[str]) -> dict[str, int]:
    """Dead letters per pool; empty when Valkey cannot be reached (the caller shows "?")."""
    try:
        found = deadletters.summaries(sync_client(), key_space(), pool_ids)
    except VALKEY_ERRORS:
        return {}
    return {summary.pool_id: summary.count for summary in found}
