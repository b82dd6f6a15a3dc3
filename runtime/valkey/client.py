"""The one way the runtime opens Valkey: a blocking pool, so bursts wait for a connection, and one
shared pipelined connection for the hot path's scripts (:mod:`runtime.valkey.pipelined`).

redis-py's default async pool raises "Too many connections" past its size; a producer with a
thousand requests in flight should queue its commands on a few connections instead.

Commands are serialized by hiredis in C when it is installed (redis-py does so for its sync client
only): the asyncio client's pure-Python ``pack_command`` was ~20 % of the dispatcher's CPU per call,
~40 µs for a FINISH call against ~6 µs (bench/RESULTS.md, issue 13).

Every connection gives up on a Valkey that stops answering without closing the socket (stopped,
partitioned away) after ``health_s``: redis-py's through ``socket_timeout``, the pipelined one through
its own watchdog, a blocking command only ``health_s`` after the time it may block. Callers then see
redis-py's ``ConnectionError``/``TimeoutError`` (:data:`REDIS_ERRORS`) and the next command connects
afresh, instead of waiting for TCP to give up, about two hours later.
"""

from __future__ import annotations

import asyncio
from functools import cache
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.utils import HIREDIS_AVAILABLE

from runtime.valkey.pipelined import DEFAULT_HEALTH_S, PipelinedConnection, Target
from runtime.valkey.url import SentinelUrl, parse_sentinel, redis_py_url

# What "Valkey is unreachable right now" looks like from redis-py: retry with backoff, never crash.
REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)
# How the pipelined connection says a failover demoted its server (runtime.valkey.pipelined).
_DEMOTED = "is now a replica"


def failing_over(exc: BaseException) -> bool:
    """Whether ``exc`` says Valkey answers but has no primary to offer right now: the sentinels name
    none, the primary refuses the connection (it died; the sentinels have not noticed yet) or calls
    itself a replica. A new primary is then seconds away (:class:`runtime.backoff.Backoff`). A Valkey
    that does not answer at all (a timeout) is not failing over."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, MasterNotFoundError | ReadOnlyError | ConnectionRefusedError):
            return True
        if isinstance(error, RedisConnectionError) and (
            _DEMOTED in str(error) or "Connection refused" in str(error)
        ):
            return True
        error = error.__cause__ or error.__context__
    return False


class ValkeyClient(aioredis.Redis):
    """redis-py's client, plus ``pipelined``: the connection :func:`runtime.valkey.lua.run_pipeline`
    sends scripts over (None where it does not apply, e.g. TLS: redis-py's pipeline then)."""

    pipelined: PipelinedConnection | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        if self.pipelined is not None:
            await self.pipelined.aclose()
        await super().aclose(close_connection_pool)
        if isinstance(self.connection_pool, SentinelConnectionPool):
            await self.connection_pool.sentinel_manager.aclose()


class BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """redis-py's sentinel pool (asks the sentinels for the primary on every new connection, drops
    idle connections when it moved, and turns a READONLY reply into a connection error) that waits
    for a free connection as :func:`connect`'s pool does."""


class _RedisPyConnection:
    """A connection of one's own through redis-py, for clients :class:`PipelinedConnection` does not
    serve (TLS, RESP3): the same ``execute``/``aclose`` surface."""

    def __init__(self, client: aioredis.Redis) -> None:
        kwargs = dict(client.connection_pool.connection_kwargs)
        self.health_s = float(kwargs.get("socket_timeout") or DEFAULT_HEALTH_S)
        # Timed per call instead (below): a blocking command may wait longer than socket_timeout.
        kwargs["socket_timeout"] = None
        pool = aioredis.ConnectionPool(
            connection_class=client.connection_pool.connection_class, max_connections=1, **kwargs
        )
        self._client = aioredis.Redis(connection_pool=pool)

    async def execute(self, commands: Any, *, block_s: float = 0.0) -> list[Any]:
        answers = []
        for command in commands:
            try:
                # redis-py drops a connection whose read is cancelled, so the next command reconnects.
                async with asyncio.timeout(block_s + self.health_s):
                    answers.append(await self._client.execute_command(*command))
            except TimeoutError as exc:
                raise RedisTimeoutError(f"Valkey did not answer {command[0]} in time") from exc
        return answers

    async def aclose(self) -> None:
        await self._client.aclose()


def valkey_server(client: aioredis.Redis) -> tuple[str, float | None]:
    """The address (host:port, never credentials) of the Valkey ``client``'s hot path talks to now, and
    since when (epoch seconds; None when unknown): after a failover, the new primary's."""
    pipelined = getattr(client, "pipelined", None)
    if isinstance(pipelined, PipelinedConnection) and pipelined.address:
        return pipelined.address, pipelined.connected_at
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        address = pool.master_address
        return (f"{address[0]}:{address[1]}" if address else ""), None
    kwargs = pool.connection_kwargs
    return str(kwargs.get("path") or f"{kwargs.get('host', '')}:{kwargs.get('port', '')}"), None


def dedicated_connection(client: aioredis.Redis) -> PipelinedConnection | _RedisPyConnection:
    """A connection of the caller's own to the client's server, for blocking commands (BLPOP, BLMPOP):
    on a shared connection they would hold everyone behind them, and one broken mid-wait (a Valkey
    restart) must not be handed back to other commands. The caller closes it (``aclose``)."""
    target = _pipelined_target(client.connection_pool)
    return PipelinedConnection(target) if target is not None else _RedisPyConnection(client)


def _pipelined_target(pool: aioredis.ConnectionPool) -> Target | None:
    """Where a :class:`PipelinedConnection` for the pool connects; None where it does not apply."""
    return Target.of_pool(pool) if HIREDIS_AVAILABLE else None


# How often a command is sent again after its pooled connection turned out to be lost.
STALE_CONNECTION_RETRIES = 2


def connect(
    url: str, *, max_connections: int = 64, pool_timeout_s: float = 20.0, health_s: float = DEFAULT_HEALTH_S
) -> ValkeyClient:
    """The runtime's client of ``url`` (a server's, or a primary's through its sentinels: see
    :mod:`runtime.valkey.url`); a command Valkey leaves unanswered for ``health_s`` fails."""
    options: dict[str, Any] = dict(
        max_connections=max_connections,
        timeout=pool_timeout_s,
        socket_connect_timeout=min(5.0, health_s),
        socket_timeout=health_s,
        socket_keepalive=True,
        health_check_interval=15,
        # A pooled connection left over from before a Valkey restart (or a failover) fails its next
        # command once: that command is sent again on a fresh connection. Only a lost connection is
        # retried; a silent Valkey (TimeoutError) still fails within ``health_s``.
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), STALE_CONNECTION_RETRIES),
        retry_on_error=[RedisConnectionError],
    )
    sentinel = parse_sentinel(url)
    pool: aioredis.ConnectionPool
    if sentinel is None:
        pool = aioredis.BlockingConnectionPool.from_url(redis_py_url(url), **options)
    else:
        pool = _sentinel_pool(sentinel, options)
    if HIREDIS_AVAILABLE:
        pool.connection_class = hiredis_packing(pool.connection_class)
    client = ValkeyClient(connection_pool=pool)
    target = _pipelined_target(pool)
    client.pipelined = PipelinedConnection(target) if target is not None else None
    return client


def _sentinel_pool(url: SentinelUrl, options: dict[str, Any]) -> BlockingSentinelPool:
    timeouts = {
        "socket_timeout": options["socket_timeout"],
        "socket_connect_timeout": options["socket_connect_timeout"],
    }
    manager = Sentinel(url.sentinels, sentinel_kwargs={**timeouts, **url.sentinel_kwargs()})
    return BlockingSentinelPool(url.master_name, manager, **options, **url.connection_kwargs())


class _HiredisPacking(AbstractConnection):
    """Serializes each command with ``hiredis.pack_command`` (redis-py's own sync serializer)."""

    def pack_command(self, *args: Any) -> list[bytes]:
        encoder = self.encoder
        if encoder.encoding.lower().replace("-", "") != "utf8" or encoder.encoding_errors != "strict":
            return super().pack_command(*args)  # hiredis encodes str as strict UTF-8 only
        return _serializer().pack(*args)


@cache
def _serializer() -> Any:
    from redis.connection import HiredisRespSerializer

    return HiredisRespSerializer()


_PACKING_CLASSES: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def hiredis_packing(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """``connection_class`` (TCP, TLS or Unix socket, as the URL chose) with hiredis packing."""
    if issubclass(connection_class, _HiredisPacking):
        return connection_class
    made = _PACKING_CLASSES.get(connection_class)
    if made is None:
        name = f"Hiredis{connection_class.__name__}"
        made = _PACKING_CLASSES[connection_class] = type(name, (_HiredisPacking, connection_class), {})
    return made
