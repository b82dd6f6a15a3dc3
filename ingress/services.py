"""Writes of producer keys: create (the key is returned once), revoke, record use."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils import timezone

from ingress.models import ProducerKey
from ingress.selectors import key_digest

KEY_PREFIX = "ldk-"


@dataclass(frozen=True, slots=True)
class CreatedKey:
    key: ProducerKey
    raw_key: str  # shown once; never stored


def new_raw_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def producer_key_create(
    *,
    name: str,
    pools: Sequence[str],
    default_pool: str | None = None,
    max_in_flight: int | None = None,
    max_queued: int | None = None,
) -> CreatedKey:
    """Creates a key (validated like the admin form does) and returns it with its one-time secret.

    ``default_pool`` None: the first pool; "": none (requests must name a pool or a model alias)."""
    raw_key = new_raw_key()
    key = ProducerKey(
        name=name,
        allowed_pools=",".join(pools),
        default_pool=(pools[0] if pools else "") if default_pool is None else default_pool,
        max_in_flight=max_in_flight,
        max_queued=max_queued,
    )
    producer_key_set_secret(key=key, raw_key=raw_key)
    key.full_clean()
    key.save()
    return CreatedKey(key, raw_key)


def producer_key_set_secret(*, key: ProducerKey, raw_key: str) -> None:
    key.key_hash = key_digest(raw_key)
    key.key_prefix = raw_key[: len(KEY_PREFIX) + 4]


def producer_key_revoke(*, key: ProducerKey) -> None:
    key.enabled = False
    key.save(update_fields=["enabled"])


def producer_key_mark_used(*, key_id: int) -> None:
    ProducerKey.objects.filter(pk=key_id).update(last_used_at=timezone.now())
