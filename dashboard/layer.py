"""The project's channel layer: channels-redis whose pooled connections survive a Valkey restart.

channels-redis keeps one connection pool per event loop for the life of the process, and redis-py
does not retry by default. After Valkey restarts, every idle connection in the pool is dead; the
next ``group_add`` (a dashboard websocket's handshake) or ``BZPOPMIN`` (its receive loop) picks one,
fails with ``ConnectionError`` and the handshake ends in HTTP 500. With a retry policy redis-py
drops the dead connection and opens a fresh one instead, within the same command.
"""

from __future__ import annotations

from typing import Any

from channels_redis.core import RedisChannelLayer as _ChannelsRedisLayer
from channels_redis.utils import create_pool
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

# A restart leaves at most a pool's worth of dead connections, each replaced on its first failure:
# one retry would do; three with a short backoff also ride out a server that is still starting.
RECONNECT_ATTEMPTS = 3
RECONNECT_BACKOFF = ExponentialBackoff(cap=0.5, base=0.05)


class RedisChannelLayer(_ChannelsRedisLayer):  # type: ignore[misc]
    """channels-redis with a reconnecting retry on every pooled connection (see the module docstring)."""

    def create_pool(self, index: int) -> Any:
        host = dict(self.hosts[index])
        host.setdefault("retry", Retry(RECONNECT_BACKOFF, RECONNECT_ATTEMPTS))
        return create_pool(host)
