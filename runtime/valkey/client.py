"""The one way the runtime opens Valkey: a blocking pool, so bursts wait for a connection.

redis-py's default async pool raises "Too many connections" past its size; a producer with a
thousand requests in flight should queue its commands on a few connections instead.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# What "Valkey is unreachable right now" looks like from redis-py: retry with backoff, never crash.
REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)


def connect(url: str, *, max_connections: int = 64, pool_timeout_s: float = 20.0) -> aioredis.Redis:
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=pool_timeout_s,
        socket_connect_timeout=5.0,
        health_check_interval=15,
    )
    return aioredis.Redis(connection_pool=pool)
