"""Reads of fabric groups and pools; admin, commands and views call these instead of the ORM."""

from __future__ import annotations

import logging

from django.db.models import QuerySet

from pools.connections import VALKEY_ERRORS, key_space, sync_client
from pools.models import FabricGroup, Pool
from runtime.dispatch import deadletters
from runtime.wire.groupconfig import GroupConfig, PoolConfig

log = logging.getLogger(__name__)


def group_get(*, group_id: str) -> FabricGroup:
    """The group; raises FabricGroup.DoesNotExist."""
    return FabricGroup.objects.get(group_id=group_id)


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


def group_config(*, group: FabricGroup, version: int = 0) -> GroupConfig:
    """The configuration dispatchers of the group run with, as published to Valkey."""
    pools = tuple(
        PoolConfig(
            pool_id=p.pool_id,
            quantum=p.quantum,
            max_concurrent=p.max_concurrent,
            min_concurrent=p.min_concurrent,
            max_burst_per_visit=p.max_burst_per_visit,
            display_name=p.display_name,
            endpoint_url=p.endpoint_url,
            enabled=p.enabled,
            paused=p.paused,
            max_attempts=p.max_attempts,
            retry_backoff_base_s=p.retry_backoff_base_s,
            retry_backoff_cap_s=p.retry_backoff_cap_s,
            max_requeues=p.max_requeues,
        )
        for p in group_pools(group=group)
    )
    return GroupConfig(
        group_id=group.group_id,
        policy=group.policy,
        total_concurrency=group.total_concurrency,
        default_endpoint_url=group.default_endpoint_url,
        api_key_env=group.api_key_env,
        queueing_enabled=group.queueing_enabled,
        delivery=group.delivery,
        name=group.name,
        pools=pools,
        version=version,
    )


def group_published_config(*, group_id: str) -> GroupConfig | None:
    """What Valkey currently holds for the group; None when nothing is published.

    Raises one of ``pools.connections.VALKEY_ERRORS`` when Valkey cannot be reached.
    """
    raw = sync_client().get(key_space().group_config(group_id))
    return GroupConfig.decode(raw) if raw else None


def pool_queue_lengths(*, pool_ids: list[str]) -> dict[str, int]:
    """Pending requests per pool (LLEN of each lane); empty when Valkey cannot be reached."""
    if not pool_ids:
        return {}
    keys = key_space()
    try:
        pipe = sync_client().pipeline(transaction=False)
        for pool_id in pool_ids:
            pipe.llen(keys.requests(pool_id))
        return dict(zip(pool_ids, (int(n) for n in pipe.execute()), strict=True))
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
