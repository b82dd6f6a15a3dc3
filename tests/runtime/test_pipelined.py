"""The shared pipelined connection: answers in order per caller, errors in place, losses survived.

Everything runs against a real Valkey over TCP; the loss tests stop and restart a private server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, NoScriptError, ResponseError

from runtime.valkey import embedded
from runtime.valkey.client import connect, dedicated_connection
from runtime.valkey.lua import LuaScript, run_pipeline
from runtime.valkey.pipelined import OUTBOX_BATCHES, PipelinedConnection, Target
from tests.support.waiting import wait_until

pytest.importorskip("hiredis")


def written(conn: PipelinedConnection) -> bool:
    """The batches sent so far have left for the server (the outbox is flushed once per loop turn)."""
    return conn.protocol is not None and not conn.protocol.outbox and bool(conn.waiting)


ECHO_AFTER_WORK = LuaScript(
    # Busy for about ARGV[2] iterations, then answers ARGV[1]: a slow command to cancel a caller during.
    "local n = 0 for i = 1, tonumber(ARGV[2]) do n = n + i end return ARGV[1]"
)


async def test_concurrent_callers_each_get_their_own_answers_in_order(aredis, keys) -> None:
    assert aredis.pipelined is not None
    key = keys.prefix + "counter"

    async def caller(i: int) -> list:
        return await aredis.pipelined.execute([("INCR", key), ("ECHO", f"caller-{i}"), ("ECHO", i)])

    answers = await asyncio.gather(*(caller(i) for i in range(200)))
    assert [a[1:] for a in answers] == [[f"caller-{i}".encode(), str(i).encode()] for i in range(200)]
    assert sorted(a[0] for a in answers) == list(range(1, 201))  # every INCR ran once
    assert int(await aredis.get(key)) == 200  # and redis-py's own connections see the same data


async def test_error_replies_come_back_in_place_as_redis_py_exceptions(aredis, keys) -> None:
    key = keys.prefix + "list"
    await aredis.rpush(key, b"x")
    before, wrong_type, noscript, after = await aredis.pipelined.execute(
        [("ECHO", "a"), ("INCR", key), ("EVALSHA", "0" * 40, 0), ("ECHO", "b")]
    )
    assert (before, after) == (b"a", b"b")
    assert isinstance(wrong_type, ResponseError) and "WRONGTYPE" in str(wrong_type)
    assert isinstance(noscript, NoScriptError)


async def test_run_pipeline_loads_a_script_the_server_does_not_know(aredis, keys) -> None:
    script = LuaScript(f"return '{keys.prefix}' .. ARGV[1]")  # a source no other test loaded
    await aredis.script_flush()
    [answer] = await run_pipeline(aredis, [script], lambda pipe: script.queue(pipe, [], ["loaded"]))
    assert answer == f"{keys.prefix}loaded".encode()
    bound = script.bind(aredis)
    assert await bound(args=["again"]) == f"{keys.prefix}again".encode()


async def test_a_bad_argument_is_refused_before_anything_is_sent(aredis, keys) -> None:
    with pytest.raises(DataError):
        await aredis.pipelined.execute([("ECHO", "fine"), ("SET", keys.prefix + "k", None)])
    # Nothing was written, so the next caller's answers are not shifted by a phantom batch.
    assert await aredis.pipelined.execute([("ECHO", "next")]) == [b"next"]
    key = keys.prefix + "buffers"
    assert await aredis.pipelined.execute([("RPUSH", key, bytearray(b"ba"), memoryview(b"mv"))]) == [2]
    assert await aredis.lrange(key, 0, -1) == [b"ba", b"mv"]


async def test_a_cancelled_caller_does_not_shift_the_next_callers_answers(aredis) -> None:
    await aredis.script_load(ECHO_AFTER_WORK.source)
    slow = asyncio.create_task(
        aredis.pipelined.execute([("EVALSHA", ECHO_AFTER_WORK.sha, 0, "slow", 3_000_000)])
    )
    await wait_until(lambda: written(aredis.pipelined), timeout=5, what="the slow script written")
    slow.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await slow
    assert await aredis.pipelined.execute([("ECHO", "mine")]) == [b"mine"]


async def test_the_database_of_the_url_is_selected(valkey_url: str, keys) -> None:
    base = valkey_url.rsplit("/", 1)[0] if valkey_url.count("/") > 2 else valkey_url
    other = connect(f"{base}/3")
    plain = aioredis.Redis.from_url(f"{base}/3")
    try:
        assert other.pipelined is not None and other.pipelined.target.db == 3
        key = keys.prefix + "db"
        await other.pipelined.execute([("SET", key, "three")])
        assert await plain.get(key) == b"three"
    finally:
        await plain.delete(keys.prefix + "db")
        await plain.aclose()
        await other.aclose()


async def test_a_closed_client_closes_its_pipelined_connection(valkey_url: str) -> None:
    client = connect(valkey_url)
    assert await client.pipelined.execute([("PING",)]) == [b"PONG"]
    await client.aclose()
    with pytest.raises(RedisConnectionError):
        await client.pipelined.execute([("PING",)])


async def test_a_lost_server_fails_the_waiting_caller_and_the_next_one_reconnects(private_valkey) -> None:
    conn = PipelinedConnection(Target(host="127.0.0.1", port=private_valkey.port))
    try:
        assert await conn.execute([("SET", "k", "before")]) == [b"OK"]
        await conn.execute([("SCRIPT", "LOAD", ECHO_AFTER_WORK.source)])
        # A caller waits on a long script while the server is killed under it.
        waiting = asyncio.create_task(conn.execute([("EVALSHA", ECHO_AFTER_WORK.sha, 0, "x", 50_000_000)]))
        await wait_until(lambda: written(conn), timeout=5, what="the long script written")
        os.kill(private_valkey.pid, signal.SIGKILL)  # SIGTERM would wait for the script to end
        with pytest.raises(RedisConnectionError):
            await waiting
        with pytest.raises(RedisConnectionError):  # nothing listens: refused, raised as redis-py's error
            await conn.execute([("PING",)])
        embedded.stop(private_valkey.data_dir)  # clears its record of the killed server
        embedded.start(private_valkey.data_dir, port=private_valkey.port)
        assert await conn.execute([("PING",)]) == [b"PONG"]
        assert conn.connects >= 2  # a fresh connection (one more if a connect raced the dying server)
    finally:
        await conn.aclose()


def test_tls_and_resp3_pools_keep_redis_py() -> None:
    assert Target.of_pool(aioredis.Redis.from_url("rediss://127.0.0.1:6380/0").connection_pool) is None
    resp3 = aioredis.Redis.from_url("redis://127.0.0.1:6379/0", protocol=3)
    assert Target.of_pool(resp3.connection_pool) is None
    unix = Target.of_pool(aioredis.Redis.from_url("unix:///tmp/valkey.sock?db=2").connection_pool)
    assert unix is not None and (unix.unix_path, unix.db) == ("/tmp/valkey.sock", 2)
    auth = Target.of_pool(aioredis.Redis.from_url("redis://user:secret@10.0.0.1:7000/4").connection_pool)
    assert auth == Target(host="10.0.0.1", port=7000, db=4, username="user", password="secret")


@pytest.mark.parametrize("protocol", [2, 3])
async def test_a_dedicated_connection_blocks_without_holding_the_shared_one(
    valkey_url, keys, protocol
) -> None:
    """RESP2 gets a pipelined connection of its own, RESP3 redis-py's: both block and answer alike."""
    client = connect(valkey_url) if protocol == 2 else aioredis.Redis.from_url(valkey_url, protocol=3)
    own = dedicated_connection(client)
    assert isinstance(own, PipelinedConnection) == (protocol == 2)
    key = keys.prefix + "replies"

    async def blocked_clients() -> int:
        return int((await client.info("clients"))["blocked_clients"])

    try:
        already = await blocked_clients()
        blocked = asyncio.create_task(own.execute([("BLMPOP", 2, 1, key, "LEFT", "COUNT", 10)]))

        async def blocking() -> bool:
            return await blocked_clients() > already

        await wait_until(blocking, timeout=5, what="the BLMPOP blocking in the server")
        assert await client.ping()  # the client's own commands are not stuck behind the BLMPOP
        await client.rpush(key, b"a", b"b")
        [popped] = await blocked
        assert [bytes(k) for k in [popped[0], *popped[1]]] == [key.encode(), b"a", b"b"]
        assert await own.execute([("BLPOP", key, 0.05)]) == [None]  # times out: nothing left
    finally:
        await own.aclose()
        await client.aclose()


async def test_a_turn_that_sends_many_batches_writes_them_in_groups_without_waiting_for_the_turn(
    aredis,
) -> None:
    """Batches of one loop turn share a write, but at most OUTBOX_BATCHES wait for the turn's end:
    a producer answering a burst of replies with new requests gets the first ones to Valkey early."""
    conn = aredis.pipelined
    await conn.execute([("PING",)])
    protocol = conn.protocol
    futures = [conn._send(protocol, [("ECHO", str(i))]) for i in range(OUTBOX_BATCHES * 2 + 1)]
    assert len(protocol.outbox) == 1  # two groups already written, in this same turn
    assert [(await future)[0] for future in futures] == [str(i).encode() for i in range(len(futures))]
