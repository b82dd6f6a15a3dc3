"""Commands are serialized by hiredis (in C) and mean exactly what redis-py's own packing means."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from runtime.valkey.client import connect, hiredis_packing

pytest.importorskip("hiredis")

ARGS = [
    ("SET", "k", "v"),
    ("SET", b"k", b"\x00\xffbinary"),
    ("EVALSHA", "a" * 40, 2, "key:é", "list:x", 1.5, 0.1, 1e-7, 10**20, -3),
    ("SET", "k", bytearray(b"ba")),
    ("SET", "k", memoryview(b"mv")),
    ("SET", "k", b"x" * 200_000),  # over redis-py's buffer cutoff
    ("CONFIG GET", "maxmemory"),  # a two-word command name
]


@pytest.mark.parametrize("args", ARGS)
def test_packing_matches_redis_py(args: tuple) -> None:
    ours = hiredis_packing(Connection)()
    assert b"".join(ours.pack_command(*args)) == b"".join(Connection().pack_command(*args))


def test_unencodable_arguments_are_refused_alike() -> None:
    for bad in (None, True, object()):
        with pytest.raises(DataError):
            hiredis_packing(Connection)().pack_command("SET", "k", bad)
        with pytest.raises(DataError):
            Connection().pack_command("SET", "k", bad)


def test_another_encoding_keeps_redis_py_packing() -> None:
    latin = hiredis_packing(Connection)(encoding="latin-1")
    assert b"".join(latin.pack_command("SET", "k", "é")) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n\xe9\r\n"


async def test_connect_packs_with_hiredis_and_round_trips(valkey_url: str, keys) -> None:
    client = connect(valkey_url)
    try:
        assert client.connection_pool.connection_class.__name__ == "HiredisConnection"
        key = keys.prefix + "packing"
        await client.rpush(key, "é", b"\xff", 7, 2.5)
        assert await client.lrange(key, 0, -1) == ["é".encode(), b"\xff", b"7", b"2.5"]
        async with client.pipeline(transaction=True) as pipe:
            pipe.incrby(key + ":n", 2).get(key + ":n")
            assert await pipe.execute() == [2, b"2"]
        await client.delete(key, key + ":n")
    finally:
        await client.aclose()
