"""Operator side: a fabric group's configuration published (stored, announced, its pools registered).

The admin publishes with a blocking client (:mod:`pools.services`); tests and benchmarks with an async
one (:func:`publish`). Dispatchers and producers read what was published (:func:`load`, the
producer's registry read).
"""

from __future__ import annotations

from typing import Any

from runtime.queue.keys import KeySpace
from runtime.queue.scripts import GROUP_PUBLISH, GROUP_UNPUBLISH
from runtime.wire.groupconfig import GroupConfig

__all__ = ["PUBLISH_SCRIPT", "UNPUBLISH_SCRIPT", "load", "publish", "publish_args", "unpublish_args"]

PUBLISH_SCRIPT = GROUP_PUBLISH
UNPUBLISH_SCRIPT = GROUP_UNPUBLISH


def publish_args(keys: KeySpace, config: GroupConfig) -> tuple[list[str], list[str | bytes]]:
    """KEYS and ARGV of ``lua/group_publish.lua``; run with a sync or an async client's ``eval``."""
    script_keys = [
        keys.group_config(config.group_id),
        keys.pool_registry(),
        keys.config_channel(config.group_id),
    ]
    args: list[str | bytes] = [config.encode(), config.group_id, *(p.pool_id for p in config.enabled_pools)]
    return script_keys, args


def unpublish_args(keys: KeySpace, group_id: str) -> tuple[list[str], list[str | bytes]]:
    """KEYS and ARGV of ``lua/group_unpublish.lua``."""
    return [keys.group_config(group_id), keys.pool_registry(), keys.config_channel(group_id)], [group_id]


async def publish(client: Any, keys: KeySpace, config: GroupConfig) -> None:
    """Publishes with an async client (runtime tests, benchmarks)."""
    script_keys, args = publish_args(keys, config)
    await client.eval(PUBLISH_SCRIPT, len(script_keys), *script_keys, *args)


async def load(client: Any, keys: KeySpace, group_id: str) -> GroupConfig | None:
    raw = await client.get(keys.group_config(group_id))
    return GroupConfig.decode(raw) if raw else None
