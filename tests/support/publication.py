"""What the pools app published to Valkey: a group's configuration and the registry of groups."""

from __future__ import annotations

import redis

from runtime.queue.keys import KeySpace
from runtime.wire.groupconfig import GroupConfig


def published(client: redis.Redis, keys: KeySpace, group_id: str) -> GroupConfig | None:
    raw = client.get(keys.group_config(group_id))
    return GroupConfig.decode(raw) if raw else None


def registry(client: redis.Redis, keys: KeySpace) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in client.hgetall(keys.pool_registry()).items()}
