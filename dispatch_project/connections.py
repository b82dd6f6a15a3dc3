"""Where the Django side finds Valkey: ``VALKEY_URL``, else the installation's embedded server.

Nothing here runs at import; the first caller starts (or finds) the embedded server.
"""

from __future__ import annotations

import functools

from django.conf import settings

from runtime.valkey import embedded
from runtime.wire.keys import KeySpace


@functools.cache
def valkey_url() -> str:
    if settings.VALKEY_URL:
        return str(settings.VALKEY_URL)
    return embedded.ensure(settings.DISPATCH_DATA_DIR).url


def key_space() -> KeySpace:
    return KeySpace(prefix=settings.DISPATCH_KEY_PREFIX)


def configure_channel_layers() -> None:
    """Points the channels-redis layer at the same Valkey as everything else."""
    config = settings.CHANNEL_LAYERS["default"].setdefault("CONFIG", {})
    redis_layer = settings.CHANNEL_LAYERS["default"]["BACKEND"].endswith("RedisChannelLayer")
    if not config.get("hosts") and redis_layer:
        config["hosts"] = [valkey_url()]


def sync_client():  # type: ignore[no-untyped-def]
    """A blocking redis-py client for views, admin services and management commands."""
    import redis

    return redis.Redis.from_url(valkey_url(), socket_timeout=5, socket_connect_timeout=2)
