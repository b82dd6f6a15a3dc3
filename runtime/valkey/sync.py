"""The blocking redis-py client of a ``VALKEY_URL`` (a server's, or a primary's through Sentinel), for
the web process, the history ingester and the span exporter: one rule for every form of the URL."""

from __future__ import annotations

from typing import Any

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

from runtime.valkey.url import parse_sentinel, redis_py_url


def sync_connect(
    url: str, *, socket_timeout: float, socket_connect_timeout: float, **options: Any
) -> redis.Redis:
    """A client whose pool reconnects to the current primary after a failover (redis-py's
    ``SentinelConnectionPool`` asks the sentinels on each new connection and treats READONLY as a
    lost connection). ``options`` go to the connection pool (``socket_keepalive``...)."""
    timeouts = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_connect_timeout}
    sentinel = parse_sentinel(url)
    if sentinel is None:
        pool = redis.ConnectionPool.from_url(redis_py_url(url), **timeouts, **options)
        return redis.Redis(connection_pool=pool)
    manager = Sentinel(sentinel.sentinels, sentinel_kwargs={**timeouts, **sentinel.sentinel_kwargs()})
    pool = SentinelConnectionPool(
        sentinel.master_name, manager, **timeouts, **options, **sentinel.connection_kwargs()
    )
    # Passed in, not made by master_for(): close() on the client then leaves the shared pool open.
    return redis.Redis(connection_pool=pool)
