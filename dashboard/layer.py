"""The project's channel layer: channels-redis whose pooled connections survive a Valkey restart.

channels-redis keeps one connection pool per event loop for the life of the process, and redis-py
does not retry by default. After Valkey restarts, every idle connection in the pool is dead; the
next ``group_add`` (a dashboard websocket's handshake) or ``BZPOPMIN`` (its receive loop) picks one,
fails with ``ConnectionError`` and the handshake ends in HTTP 500. With a retry policy redis-py
drops the dead connection and opens a fresh one instead, within the same command. Behind Sentinel
(``VALKEY_URL`` in its sentinel form, see :func:`pools.connections.channel_layer_host`) the fresh
connection goes to the primary the sentinels name now, and a READONLY reply from a demoted one counts
as a lost connection (redis-py's ``SentinelConnectionPool``).

A Valkey that stops answering without closing the socket (stopped, partitioned away) fails a command
after ``DISPATCH_VALKEY_HEALTH_S`` beyond what it may block (the receive loop's BZPOPMIN waits
``brpop_timeout``), instead of hanging a websocket's handshake or disconnect with it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels_redis.core import RedisChannelLayer as _ChannelsRedisLayer
from channels_redis.utils import create_pool
from django.conf import settings
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

# A restart leaves at most a pool's worth of dead connections, each replaced on its first failure:
# one retry would do; three with a short backoff also ride out a server that is still starting.
RECONNECT_ATTEMPTS = 3
RECONNECT_BACKOFF = ExponentialBackoff(cap=0.5, base=0.05)
# While Valkey is down, a consumer's receive loop waits this long between attempts.
RECEIVE_RETRY_S = 1.0


class RedisChannelLayer(_ChannelsRedisLayer):  # type: ignore[misc]
    """channels-redis with a reconnecting retry on every pooled connection (see the module docstring)."""

    def create_pool(self, index: int) -> Any:
        host = dict(self.hosts[index])
        host.setdefault("retry", Retry(RECONNECT_BACKOFF, RECONNECT_ATTEMPTS))
        host.setdefault("socket_timeout", self.brpop_timeout + settings.DISPATCH_VALKEY_HEALTH_S)
        host.setdefault("socket_keepalive", True)
        if "master_name" in host:  # Sentinel: the pool asks the sentinels for the primary on each connect
            sentinel_kwargs = host["sentinel_kwargs"] = dict(host.get("sentinel_kwargs") or {})
            sentinel_kwargs.setdefault("socket_timeout", settings.DISPATCH_VALKEY_HEALTH_S)
            sentinel_kwargs.setdefault("socket_connect_timeout", settings.DISPATCH_VALKEY_HEALTH_S)
        return create_pool(host)

    async def receive(self, channel: str) -> Any:
        """channels-redis' receive, waiting out a Valkey outage instead of raising.

        The receive loop runs for the life of every websocket; raising would end each of them (a
        handshake in progress becomes HTTP 500). The consumer reads Valkey itself and tells the
        browser that Valkey is unreachable meanwhile.
        """
        while True:
            try:
                return await super().receive(channel)
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                log.debug("channel layer receive waits for Valkey: %s", exc)
                await asyncio.sleep(RECEIVE_RETRY_S)
