"""Where the Django side finds Valkey: ``VALKEY_URL``, else the installation's embedded server.

One cached blocking client per URL (its connection pool is shared by threads and reused across
requests) and one tuple of the errors that mean "Valkey is unreachable or refused the command".
Nothing here runs at import; the first caller starts (or finds) the embedded server.
"""

from __future__ import annotations

import functools

import redis
from django.conf import settings

from runtime.errors import DispatchError
from runtime.queue.keys import KeySpace
from runtime.valkey import embedded
from runtime.valkey.sync import sync_connect
from runtime.valkey.url import parse_sentinel, redis_py_url

# Valkey-side failures a view, admin action or command reports instead of crashing: redis-py's own
# errors, sockets that fail before redis-py wraps them, an embedded server that cannot start, and a
# published document that does not decode.
VALKEY_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.RedisError,
    OSError,
    embedded.EmbeddedValkeyError,
    DispatchError,
)


@functools.cache
def valkey_url() -> str:
    if settings.VALKEY_URL:
        return str(settings.VALKEY_URL)
    return embedded.ensure(settings.DISPATCH_DATA_DIR, appendfsync=settings.DISPATCH_VALKEY_APPENDFSYNC).url


def key_space() -> KeySpace:
    return KeySpace(prefix=settings.DISPATCH_KEY_PREFIX)


def configure_channel_layers() -> None:
    """Points the channels-redis layer at the same Valkey as everything else."""
    config = settings.CHANNEL_LAYERS["default"].setdefault("CONFIG", {})
    redis_layer = settings.CHANNEL_LAYERS["default"]["BACKEND"].endswith("RedisChannelLayer")
    if not config.get("hosts") and redis_layer:
        config["hosts"] = [channel_layer_host(valkey_url())]


def channel_layer_host(url: str) -> str | dict[str, object]:
    """channels-redis' ``hosts`` entry for ``url``: its own sentinel form for a Sentinel URL."""
    sentinel = parse_sentinel(url)
    if sentinel is None:
        return redis_py_url(url)
    return {
        "sentinels": list(sentinel.sentinels),
        "master_name": sentinel.master_name,
        "sentinel_kwargs": sentinel.sentinel_kwargs(),
        **sentinel.connection_kwargs(),
    }


def sync_client() -> redis.Redis:
    """The process's blocking redis-py client for views, admin services and management commands.

    Shared and thread-safe; ``close()`` on it only returns its connection to the pool (the pool is
    passed in, so redis-py does not tear it down), so callers may keep closing what they open.
    """
    return _client_for(valkey_url(), float(settings.DISPATCH_VALKEY_HEALTH_S))


def valkey_client(client: redis.Redis | None = None) -> redis.Redis:
    """The client a read runs on: the caller's, so several reads share one connection, else the
    process's shared one. Nothing to close either way (closing the shared client only returns its
    connection to the pool); the caller maps :data:`VALKEY_ERRORS` once, where it reports them.
    """
    return sync_client() if client is None else client


@functools.cache
def _client_for(url: str, health_s: float) -> redis.Redis:
    # A Valkey that stops answering (stopped, partitioned away) fails a read after health_s: a view or
    # the dashboard's refresh reports it as unreachable instead of hanging with it.
    return sync_connect(
        url, socket_timeout=health_s, socket_connect_timeout=min(2.0, health_s), socket_keepalive=True
    )
