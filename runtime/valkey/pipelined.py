"""One Valkey connection shared by every coroutine of a process for its non-blocking hot-path commands.

Why: redis-py's asyncio client spends more CPU around a command than Valkey spends running it (a pool
checkout and release, a ``Pipeline`` object, its retry wrapper, per-command response callbacks):
at concurrency 16 that layer was about a quarter of the dispatcher's CPU per call (bench/RESULTS.md,
issue 13). Here commands are serialized by hiredis, written as they come, and their answers, which
Valkey sends in order on one connection, are parsed by hiredis and handed back in that order. Batches
from concurrent callers share the connection without waiting for each other.

Only commands that answer at once belong here (scripts, ZCARD): a blocking command (BLPOP) would hold
every caller behind it, so those keep their own redis-py connection.

Failures look like redis-py's: a lost or refused connection raises redis-py's ``ConnectionError`` to
every batch still waiting for answers (they may or may not have run, as with any client), and the next
batch connects again. An error reply (NOSCRIPT, a script error) is returned in the batch's results as
the exception redis-py would have raised, for the caller to inspect.

A server that stops answering without closing the socket (stopped, partitioned away) is a loss too:
while batches wait, Valkey must send something within ``Target.health_s`` (plus the time the head
batch's blocking command may legitimately wait), else the connection is dropped as lost. Without
this the waiting batches hung until TCP gave up, about two hours later.

Behind Valkey Sentinel (a pool of :class:`redis.asyncio.sentinel.SentinelConnectionPool`), each connect
asks the sentinels where the primary is now, and a READONLY reply (the server was demoted to a replica
by a failover) is a loss too: the next batch connects to the new primary.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import hiredis
from redis._parsers.base import BaseParser
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, InvalidResponse, ReadOnlyError

from runtime.immutable import immutable

__all__ = ["PipelinedConnection", "Target"]

Command = Sequence[Any]
_NOT_YET = object()  # hiredis' answer while a reply is still incomplete
OUTBOX_BATCHES = 16  # batches held for one write at most
# How long waiting batches may go without a byte from Valkey where the client sets no socket_timeout.
DEFAULT_HEALTH_S = 5.0
HEALTH_CHECKS = 4  # silence is looked at this many times per health_s: found within 1.25 health_s


@immutable
class Target:
    """Where and as whom to connect (read from a redis-py connection pool's settings)."""

    host: str = "127.0.0.1"
    port: int = 6379
    unix_path: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    connect_timeout_s: float = 5.0
    encoding: str | None = None  # decode bulk strings as the client does (decode_responses)
    # Waiting batches hear from Valkey within this (beyond a blocking command's own wait) or it is lost.
    health_s: float = DEFAULT_HEALTH_S
    # Where the primary is now (host, port), asked on every connect instead of host/port (Sentinel).
    locate: Callable[[], Awaitable[tuple[str, int]]] | None = None

    @classmethod
    def of_pool(cls, pool: Any) -> Target | None:
        """The target of a redis-py pool, or None where this connection does not apply (TLS, RESP3,
        custom connection classes): the caller then keeps redis-py's pipeline."""
        kwargs = pool.connection_kwargs
        connection_class = pool.connection_class
        if kwargs.get("protocol") not in (None, 2, "2") or kwargs.get("credential_provider"):
            return None
        unix = issubclass(connection_class, UnixDomainSocketConnection)
        if issubclass(connection_class, SSLConnection) or not (
            unix or issubclass(connection_class, Connection)
        ):
            return None
        return cls(
            host=kwargs.get("host", "127.0.0.1"),
            port=int(kwargs.get("port", 6379)),
            unix_path=kwargs.get("path", "") if unix else "",
            db=int(kwargs.get("db", 0) or 0),
            username=kwargs.get("username"),
            password=kwargs.get("password"),
            connect_timeout_s=kwargs.get("socket_connect_timeout") or 5.0,
            encoding=kwargs.get("encoding", "utf-8") if kwargs.get("decode_responses") else None,
            health_s=kwargs.get("socket_timeout") or DEFAULT_HEALTH_S,
            locate=pool.get_master_address if isinstance(pool, SentinelConnectionPool) else None,
        )


def _packed(command: Command) -> bytes:
    """One command in RESP, as redis-py would send it; its DataError for what it would refuse."""
    try:
        return hiredis.pack_command(tuple(command))
    except TypeError as exc:  # hiredis takes str, bytes, int and float only
        if any(isinstance(arg, bytearray | memoryview) for arg in command):
            return _packed(
                [bytes(arg) if isinstance(arg, bytearray | memoryview) else arg for arg in command]
            )
        raise DataError(f"invalid argument in {command[0]!r}: {exc}") from exc


class _Batch:
    """The answers one caller waits for, in the order its commands were written."""

    __slots__ = ("block_s", "future", "remaining", "results")

    def __init__(self, future: asyncio.Future[list[Any]], count: int, block_s: float) -> None:
        self.future = future
        self.remaining = count
        self.results: list[Any] = []
        self.block_s = block_s  # how long the server may hold its answer back (a blocking command)


class _Protocol(asyncio.Protocol):
    """Feeds one connection's bytes to hiredis and hands complete answers to the waiting batches."""

    def __init__(self, owner: PipelinedConnection) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.outbox: list[bytes] = []
        self.reader = hiredis.Reader(
            protocolError=InvalidResponse,
            replyError=BaseParser.parse_error,
            notEnoughData=_NOT_YET,
            **({"encoding": owner.target.encoding} if owner.target.encoding else {}),
        )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def flush(self) -> None:
        """Writes what this loop turn's batches queued, in one system call: on loopback a write also
        pays for delivering it to Valkey, the largest single cost of a batch (py-spy, issue 13)."""
        outbox, self.outbox = self.outbox, []
        if outbox and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(outbox))

    def data_received(self, data: bytes) -> None:
        owner = self.owner
        if owner.protocol is not self:
            return
        owner.quiet_since = owner.clock()  # one clock read per socket read, not per answer
        self.reader.feed(data)
        waiting = owner.waiting
        try:
            while (reply := self.reader.gets()) is not _NOT_YET:
                if isinstance(reply, ReadOnlyError):  # a failover demoted this server: find the new one
                    owner.lost(
                        self, RedisConnectionError(f"Valkey at {owner.address} is now a replica: {reply}")
                    )
                    return
                batch = waiting[0]
                batch.results.append(reply)
                batch.remaining -= 1
                if not batch.remaining:
                    waiting.popleft()
                    if not batch.future.done():  # a cancelled caller's answers are read and dropped
                        batch.future.set_result(batch.results)
        except (InvalidResponse, IndexError) as exc:  # garbage, or an answer nobody asked for
            self.owner.lost(self, RedisConnectionError(f"Valkey sent an unreadable reply: {exc!r}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.lost(self, RedisConnectionError(f"Connection to Valkey lost: {exc or 'closed'}"))


class PipelinedConnection:
    """``await execute(commands)``: their answers, in order; commands of concurrent callers interleave
    per batch on one connection. Connects on first use (in the running loop) and after a loss."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.waiting: collections.deque[_Batch] = collections.deque()
        self.protocol: _Protocol | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._closed = False
        self.connects = 0  # connections opened so far (the first, and one after each loss)
        self.address = ""  # host:port (or socket path) of the latest connection
        self.connected_at: float | None = None  # when it was opened (epoch seconds)
        self.silences = 0  # connections dropped because Valkey went quiet with batches waiting
        # Since when waiting batches have heard nothing (the last byte read, or the first batch sent).
        self.quiet_since = 0.0
        self.clock: Callable[[], float] = time.monotonic  # the running loop's clock once bound to it
        self._watchdog: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        where = self.address or self.target.unix_path or f"{self.target.host}:{self.target.port}"
        state = "open" if self.protocol is not None else "not connected"
        return f"<PipelinedConnection {where}/{self.target.db} {state} waiting={len(self.waiting)}>"

    async def execute(self, commands: Sequence[Command], *, block_s: float = 0.0) -> list[Any]:
        """Writes ``commands`` and returns their answers (error replies as redis-py's exceptions).

        ``block_s``: how long a blocking command among them (BLPOP on a dedicated connection) may wait
        in the server before it answers; silence is a loss only ``health_s`` beyond it.
        """
        if not commands:
            return []
        protocol = self.protocol
        if protocol is None or self._loop is not asyncio.get_running_loop():
            protocol = await self._connected()
        return await self._send(protocol, commands, block_s)

    def _send(
        self, protocol: _Protocol, commands: Sequence[Command], block_s: float = 0.0
    ) -> asyncio.Future[list[Any]]:
        assert self._loop is not None and protocol.transport is not None
        payload = b"".join([_packed(command) for command in commands])  # refused before anything is sent
        future: asyncio.Future[list[Any]] = self._loop.create_future()
        if not self.waiting:  # silence counts from now: an idle connection owes nobody an answer
            self.quiet_since = self._loop.time()
            if self._watchdog is None:
                self._watchdog = self._loop.call_later(self._check_every(), self._check_silence)
        self.waiting.append(_Batch(future, len(commands), block_s))
        # Written once per loop turn: every batch sent in this turn leaves in the same write. A turn
        # that sends many (a producer answering a burst of replies with new requests) writes every
        # OUTBOX_BATCHES of them at once: Valkey can start on the first before the turn ends.
        if not protocol.outbox:
            self._loop.call_soon(protocol.flush)
        protocol.outbox.append(payload)
        if len(protocol.outbox) >= OUTBOX_BATCHES:
            protocol.flush()
        return future

    def _check_every(self) -> float:
        return self.target.health_s / HEALTH_CHECKS

    def _check_silence(self) -> None:
        """The watchdog, ticking while batches wait: a connection that has been silent for longer than
        ``health_s`` past what its oldest batch may block is lost (Valkey stopped or partitioned away)."""
        self._watchdog = None
        if not self.waiting or self._loop is None:
            return  # nothing owed; the next batch re-arms
        allowed = self.target.health_s + self.waiting[0].block_s
        silent_for = self._loop.time() - self.quiet_since
        if silent_for > allowed:
            self.silences += 1
            self.lost(
                self.protocol,
                RedisConnectionError(
                    f"Valkey sent nothing for {silent_for:.1f}s with answers owed "
                    f"(health check {self.target.health_s:g}s): connection dropped"
                ),
            )
            return
        self._watchdog = self._loop.call_later(self._check_every(), self._check_silence)

    def lost(self, protocol: _Protocol | None, exc: Exception) -> None:
        """The connection of ``protocol`` is gone: every waiting batch fails with ``exc``, and the next
        batch connects again. A late notice from an older connection changes nothing."""
        if protocol is not self.protocol:
            return
        self.protocol = None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.abort()
        waiting, self.waiting = self.waiting, collections.deque()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for batch in waiting:
            if not batch.future.done():
                batch.future.set_exception(exc)

    async def aclose(self) -> None:
        self._closed = True
        self.lost(self.protocol, RedisConnectionError("Connection to Valkey closed by the client"))

    async def _connected(self) -> _Protocol:
        if self._closed:
            raise RedisConnectionError("the Valkey connection is closed")
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a client reused under another loop starts afresh there
            self.lost(self.protocol, RedisConnectionError("Valkey connection of another event loop"))
            self._loop, self._lock, self.clock = loop, asyncio.Lock(), loop.time
        assert self._lock is not None
        async with self._lock:  # one connect at a time; the callers behind it use its connection
            if self.protocol is None:
                try:
                    await self._open(loop)
                except (OSError, TimeoutError, RedisConnectionError) as exc:
                    failure = (
                        exc
                        if isinstance(exc, RedisConnectionError)
                        else RedisConnectionError(f"could not connect to Valkey ({self!r}): {exc!r}")
                    )
                    self.lost(self.protocol, failure)
                    raise failure from exc
            return self.protocol  # type: ignore[return-value]

    async def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        target = self.target
        host, port = (await target.locate()) if target.locate is not None else (target.host, target.port)
        async with asyncio.timeout(target.connect_timeout_s):
            if target.unix_path:
                _, protocol = await loop.create_unix_connection(lambda: _Protocol(self), target.unix_path)
            else:
                transport, protocol = await loop.create_connection(lambda: _Protocol(self), host, port)
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            self.protocol = protocol
            self.connects += 1
            self.address, self.connected_at = target.unix_path or f"{host}:{port}", time.time()
            hello: list[Command] = []
            if target.password is not None:
                hello.append(["AUTH", *([target.username] if target.username else []), target.password])
            if target.db:
                hello.append(["SELECT", target.db])
            # Written before any caller's command, so the server applies them first.
            answers = await self._send(protocol, hello) if hello else []
        for answer in answers:
            if isinstance(answer, Exception):
                raise RedisConnectionError(f"Valkey refused the connection: {answer}")
