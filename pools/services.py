"""Writes to fabric groups and pools, and their publication to running dispatchers.

Every write that changes what dispatchers should run is followed by a publication of the group: one
atomic script (runtime/queue/lua/group_publish.lua) stores the group's config JSON, rewrites the
group's entries in the pool registry producers check at submit, and notifies the group's config channel.
Writes publish through :func:`publish_on_commit`: inside a database transaction (the admin runs every
change in one) dispatchers see the configuration only once it is committed, and never one that was
rolled back. Publishing never raises: when Valkey cannot be reached the database write stands, the
failure comes back as a :class:`PublishResult` with an error for the caller to show, and
``manage.py pools_publish`` repairs it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

import redis
from django.db import transaction

from pools import selectors
from pools.connections import VALKEY_ERRORS, key_space, sync_client
from pools.models import Backend, FabricGroup, Pool
from pools.validation import group_problems, pool_values
from runtime.dispatch import deadletters
from runtime.errors import DispatchError
from runtime.policy.tenants import OFF
from runtime.queue.groups import PUBLISH_SCRIPT, UNPUBLISH_SCRIPT, publish_args, unpublish_args
from runtime.wire.groupconfig import GroupConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PublishResult:
    """The outcome of publishing (or unpublishing) one group; ``error`` is empty on success."""

    group_id: str
    version: int = 0
    pools: int = 0  # enabled pools now in the registry
    error: str = ""
    unpublished: bool = False  # the group's configuration was removed (the group no longer exists)

    @property
    def ok(self) -> bool:
        return not self.error


def _next_version(client: redis.Redis, group_id: str) -> int:
    """A millisecond timestamp, bumped past the published version so it increases on every publish."""
    now_ms = time.time_ns() // 1_000_000
    raw = client.get(key_space().group_config(group_id))
    if not raw:
        return now_ms
    try:
        previous = GroupConfig.decode(raw).version
    except DispatchError:
        return now_ms
    return max(now_ms, previous + 1)


def group_publish(*, group: FabricGroup) -> PublishResult:
    """Publishes the group's current configuration to Valkey for its running dispatchers."""
    config = selectors.group_config(group=group)
    pools = [pool_values(p) for p in config.pools]
    problems = group_problems(policy=config.policy, total_concurrency=config.total_concurrency, pools=pools)
    if problems:
        error = "not published, the configuration is invalid: " + "; ".join(problems)
        return PublishResult(group.group_id, error=error)
    try:
        client = sync_client()
        version = _next_version(client, group.group_id)
        config = replace(config, version=version)
        script_keys, args = publish_args(key_space(), config)
        count = int(client.eval(PUBLISH_SCRIPT, len(script_keys), *script_keys, *args))
    except VALKEY_ERRORS as exc:
        log.warning("could not publish group %s: %s", group.group_id, exc)
        return PublishResult(group.group_id, error=f"Valkey unreachable ({exc})")
    log.info("published group %s version %s with %s enabled pools", group.group_id, version, count)
    return PublishResult(group.group_id, version=version, pools=count)


def group_unpublish(*, group_id: str) -> PublishResult:
    """Removes a group's configuration and pool registry entries; its dispatchers see an empty config."""
    try:
        script_keys, args = unpublish_args(key_space(), group_id)
        sync_client().eval(UNPUBLISH_SCRIPT, len(script_keys), *script_keys, *args)
    except VALKEY_ERRORS as exc:
        log.warning("could not unpublish group %s: %s", group_id, exc)
        return PublishResult(group_id, error=f"Valkey unreachable ({exc})")
    return PublishResult(group_id, unpublished=True)


def group_publish_all(*, prune: bool = True) -> list[PublishResult]:
    """Publishes every group; with ``prune``, unpublishes registry entries of groups no longer in the DB."""
    results = [group_publish(group=group) for group in selectors.group_list()]
    if prune and all(r.ok for r in results):
        known = {r.group_id for r in results}
        try:
            registry = sync_client().hgetall(key_space().pool_registry())
        except VALKEY_ERRORS as exc:
            return [*results, PublishResult("*", error=f"Valkey unreachable ({exc})")]
        stale = sorted({v.decode() for v in registry.values()} - known)
        results.extend(group_unpublish(group_id=group_id) for group_id in stale)
    return results


def publish_on_commit(*, group_ids: Iterable[str]) -> list[PublishResult]:
    """Publishes the groups once the current transaction commits (at once outside a transaction).

    Returns the list the results are appended to: already filled outside a transaction, filled at
    commit inside one, left empty on rollback. A caller that reports them registers its own
    ``transaction.on_commit`` afterwards: commit hooks run in registration order.
    """
    group_ids = sorted(set(group_ids))
    results: list[PublishResult] = []
    transaction.on_commit(lambda: results.extend(group_publish_many(group_ids=group_ids)))
    return results


def group_save(*, group: FabricGroup, publish: bool = True) -> list[PublishResult]:
    """Validates and saves the group; publishes it at commit unless the caller publishes later."""
    group.full_clean()
    group.save()
    return publish_on_commit(group_ids=[group.group_id]) if publish else []


def group_delete(*, group: FabricGroup) -> list[PublishResult]:
    """Deletes the group and its pools and, at commit, removes them from Valkey (queued requests stay)."""
    group_id = group.group_id
    group.delete()
    return publish_on_commit(group_ids=[group_id])


def backend_save(*, backend: Backend) -> list[PublishResult]:
    """Validates and saves the backend; republishes, at commit, every group that uses it."""
    backend.full_clean()
    backend.save()
    return publish_on_commit(group_ids=selectors.backend_group_ids(backend=backend))


def backend_delete(*, backend: Backend) -> None:
    """Deletes a backend no group or pool uses (the database protects the ones in use)."""
    backend.delete()


def pool_save(*, pool: Pool, publish: bool = True) -> list[PublishResult]:
    """Validates and saves the pool; publishes its group, and the group it left when it moved."""
    previous_group_id = (
        Pool.objects.filter(pk=pool.pk).values_list("group_id", flat=True).first() if pool.pk else None
    )
    pool.full_clean()
    pool.save()
    if not publish:
        return []
    return publish_on_commit(group_ids={pool.group_id, previous_group_id} - {None})


def pool_delete(*, pool: Pool, publish: bool = True) -> list[PublishResult]:
    """Deletes the pool; its queued requests stay in their list, the registry refuses new submits."""
    group_id = pool.group_id
    pool.delete()
    return publish_on_commit(group_ids=[group_id]) if publish else []


def pool_set_paused(*, pools: Iterable[Pool], paused: bool) -> list[PublishResult]:
    """Pauses or resumes pools (queued work stays queued) and republishes each affected group once."""
    pks = [p.pk for p in pools]
    with transaction.atomic():
        Pool.objects.filter(pk__in=pks).update(paused=paused)
        group_ids = set(Pool.objects.filter(pk__in=pks).values_list("group_id", flat=True))
        return publish_on_commit(group_ids=group_ids)


def pool_pause(*, pool: Pool) -> list[PublishResult]:
    results = pool_set_paused(pools=[pool], paused=True)
    pool.paused = True
    return results


def pool_resume(*, pool: Pool) -> list[PublishResult]:
    results = pool_set_paused(pools=[pool], paused=False)
    pool.paused = False
    return results


def group_publish_many(*, group_ids: Iterable[str]) -> list[PublishResult]:
    """Publishes each group (unpublishes the ones that no longer exist), in id order."""
    results = []
    for group_id in sorted(group_ids):
        try:
            group = selectors.group_get(group_id=group_id)
        except FabricGroup.DoesNotExist:
            results.append(group_unpublish(group_id=group_id))
        else:
            results.append(group_publish(group=group))
    return results


@dataclass(frozen=True, slots=True)
class DeadLetterResult:
    """What an operator's replay or discard did: ``done`` False when the letter was already gone."""

    request_id: str  # "" for an unreadable letter
    done: bool
    error: str = ""


GONE = "it is no longer in the dead-letter list (replayed or discarded meanwhile)"


def dead_letter_replay(*, pool: Pool, digest: str) -> DeadLetterResult:
    """Queues a dead letter again at the tail of its pool, as a fresh first attempt without deadline."""
    return _take_dead_letter(pool=pool, digest=digest, replay=True)


def dead_letter_discard(*, pool: Pool, digest: str) -> DeadLetterResult:
    """Removes a dead letter for good."""
    return _take_dead_letter(pool=pool, digest=digest, replay=False)


def _take_dead_letter(*, pool: Pool, digest: str, replay: bool) -> DeadLetterResult:
    client, keys = sync_client(), key_space()
    try:
        stored = deadletters.find(client, keys, pool.pool_id, digest)
        if stored is None:
            return DeadLetterResult("", False, GONE)
        request_id = stored.letter.request_id if stored.letter else ""
        if replay:
            done = deadletters.replay(client, keys, pool.pool_id, stored, fair=pool.tenant_fairness != OFF)
        else:
            done = deadletters.discard(client, keys, pool.pool_id, stored)
    except VALKEY_ERRORS as exc:
        return DeadLetterResult("", False, str(exc) or exc.__class__.__name__)
    return DeadLetterResult(request_id, done, "" if done else GONE)
