"""Durable pushes: answered once Valkey has fsynced them (WAITAOF), over a real server.

Against the embedded Valkey 8 the pushes wait for the fsync and share it; against a server without
WAITAOF (the machine's Redis 7.0 under VALKEY_URL, or a Valkey with the command renamed away) each
push is answered once in memory and counted ``waitaof_unsupported``; with the AOF off, ``aof_off``.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runtime.errors import QueueFull
from runtime.producer import Producer
from runtime.queue import groups, registry
from runtime.valkey import embedded
from runtime.valkey.client import connect
from runtime.valkey.persisted import (
    AOF_OFF,
    NOT_PERSISTED,
    PERSISTED,
    WAITAOF_UNSUPPORTED,
    PersistedPusher,
)
from runtime.wire.groupconfig import DURABLE, GroupConfig, PoolConfig
from tests.support.waiting import wait_until, wait_until_sync

_PUSH = registry.script("push")
CALL = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}


def has_waitaof(sredis: redis.Redis) -> bool:
    try:
        sredis.execute_command("WAITAOF", 0, 0, 0)  # asks for nothing: answers at once where it exists
    except redis.ResponseError:
        return False
    return True


def waitaof_calls(sredis: redis.Redis) -> int:
    return int(sredis.info("commandstats").get("cmdstat_waitaof", {}).get("calls", 0))


async def push_many(pusher: PersistedPusher, keys, count: int) -> list[tuple[object, str]]:
    args = [1, 60_000]
    return await asyncio.gather(
        *(
            pusher.push(_PUSH, [keys.requests("p"), keys.wake_list("p")], [f"r{i}", *args], replicas=0)
            for i in range(count)
        )
    )


async def test_concurrent_durable_pushes_are_answered_after_a_shared_fsync(valkey_url, sredis, keys) -> None:
    client = connect(valkey_url)
    pusher = PersistedPusher(client)
    before = waitaof_calls(sredis)
    try:
        answers = await push_many(pusher, keys, 50)
    finally:
        await pusher.aclose()
        await client.aclose()
    assert sorted(int(length) for length, _ in answers) == list(range(1, 51))
    assert sredis.llen(keys.requests("p")) == 50
    if has_waitaof(sredis) and sredis.config_get("appendonly")["appendonly"] == "yes":
        assert pusher.outcomes == {PERSISTED: 50}
        # A group commit: the pushes that arrive while one WAITAOF waits share the next one.
        assert 1 <= waitaof_calls(sredis) - before < 50
    elif not has_waitaof(sredis):
        assert pusher.outcomes == {WAITAOF_UNSUPPORTED: 50}


async def test_a_server_with_its_aof_off_answers_and_counts_aof_off(private_valkey, keys) -> None:
    with redis.Redis.from_url(private_valkey.url) as admin:
        admin.config_set("appendonly", "no")
    client = connect(private_valkey.url)
    pusher = PersistedPusher(client)
    try:
        first = await push_many(pusher, keys, 5)
        second = await push_many(pusher, keys, 5)  # learnt: no WAITAOF 1 sent any more
    finally:
        await pusher.aclose()
        await client.aclose()
    assert [outcome for _, outcome in first + second] == [AOF_OFF] * 10
    assert pusher.outcomes == {AOF_OFF: 10}


@contextlib.contextmanager
def raw_valkey(data_dir: Path, *extra: str) -> Iterator[str]:
    """A Valkey server started with ``extra`` arguments (the embedded starter takes none); its URL."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = embedded.free_port()
    proc = subprocess.Popen(
        [embedded.valkey_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--dir", str(data_dir), "--appendonly", "yes", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until_sync(lambda: embedded.ping(port), timeout=10, what="valkey up")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(5)


@pytest.fixture
def valkey_without_waitaof(tmp_path: Path) -> Iterator[str]:
    """A real Valkey whose WAITAOF is renamed away: it answers as a Redis 7.0 does ("unknown command")."""
    with raw_valkey(tmp_path / "no-waitaof", "--rename-command", "WAITAOF", "") as url:
        yield url


async def test_a_server_without_waitaof_is_detected_once_and_counted(valkey_without_waitaof, keys) -> None:
    client = connect(valkey_without_waitaof)
    pusher = PersistedPusher(client)
    try:
        await push_many(pusher, keys, 3)
        await push_many(pusher, keys, 3)
    finally:
        await pusher.aclose()
        await client.aclose()
    assert pusher.outcomes == {WAITAOF_UNSUPPORTED: 6}
    with redis.Redis.from_url(valkey_without_waitaof) as check:
        assert check.llen(keys.requests("p")) == 6  # answered, and queued, all the same


def durable_group(**pool: object) -> GroupConfig:
    return GroupConfig(
        group_id="g",
        policy="fifo",
        default_endpoint_url="http://127.0.0.1:9/v1",
        delivery=DURABLE,
        pools=(PoolConfig(pool_id="default", **pool),),  # type: ignore[arg-type]
        version=1,
    )


async def test_a_durable_producer_keeps_admission_limits_and_counts_what_was_not_persisted(
    aredis, sredis, keys
) -> None:
    await groups.publish(aredis, keys, durable_group(max_queued=1))
    async with Producer(aredis, keys=keys) as producer:
        first = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=30))
        await wait_until(lambda: sredis.llen(keys.requests("default")) == 1, what="first request queued")
        with pytest.raises(QueueFull):
            await producer.submit(CALL, pool_id="default", timeout=30)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
    assert producer.persistence.outcomes.total() == 2  # both took the persisted path, the refused one too
    if has_waitaof(sredis):
        assert producer.persistence.outcomes == {PERSISTED: 2} and producer.stats.unpersisted_pushes == 0
    else:  # Redis 7.0: the admitted push is answered from memory, and counted
        assert producer.persistence.outcomes == {WAITAOF_UNSUPPORTED: 2}
        assert producer.stats.unpersisted_pushes == 1


async def test_pushes_answered_without_waitaof_are_counted_in_the_groups_counters(
    valkey_without_waitaof, keys
) -> None:
    client = connect(valkey_without_waitaof)
    try:
        await groups.publish(client, keys, durable_group())
        async with Producer(client, keys=keys) as producer:
            waiting = [
                asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=30)) for _ in range(3)
            ]
            await wait_until(lambda: producer.persistence.outcomes.total() == 3, what="3 pushes answered")
            # The pusher counts a batch's outcome before the submits awaiting it resume and count theirs.
            await wait_until(lambda: producer.stats.unpersisted_pushes == 3, what="3 unpersisted counted")
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
        # Flushed with the liveness refresh, and at the latest when the producer closes.
        counted = await client.hget(keys.counters("g"), "unpersisted:waitaof_unsupported")
        assert int(counted or 0) == 3
    finally:
        await client.aclose()


def replica_of(primary_url: str, data_dir: Path, *extra: str) -> contextlib.AbstractContextManager[str]:
    port = primary_url.rsplit(":", 1)[1].split("/")[0]
    return raw_valkey(data_dir, "--replicaof", "127.0.0.1", port, *extra)


def wait_for_replicas(url: str, count: int) -> None:
    with redis.Redis.from_url(url) as check:
        wait_until_sync(
            lambda: (
                check.info("replication")["connected_slaves"] == count
                and check.execute_command("WAIT", count, 1000) == count
            ),
            timeout=20,
            what=f"{count} replica(s) in sync",
        )


@pytest.mark.parametrize("waitaof", [True, False], ids=["waitaof", "wait"])
async def test_a_push_waits_for_the_replicas_the_group_asks_for(tmp_path: Path, keys, waitaof: bool) -> None:
    no_waitaof = () if waitaof else ("--rename-command", "WAITAOF", "")
    with raw_valkey(tmp_path / "primary", *no_waitaof) as primary:
        client = connect(primary)
        pusher = PersistedPusher(client)  # the default timeout: a replica fsyncs its AOF every second
        try:
            with replica_of(primary, tmp_path / "replica"):
                wait_for_replicas(primary, 1)
                [(_, outcome)] = await push_to_replicas(pusher, keys, 1)
                assert outcome == (PERSISTED if waitaof else WAITAOF_UNSUPPORTED)
                [(_, outcome)] = await push_to_replicas(pusher, keys, 1)  # learnt: WAIT on this server
                assert outcome == PERSISTED
            # The replica is gone: the push is queued all the same, and counted short of its replica.
            [(length, outcome)] = await push_to_replicas(pusher, keys, 1)
            assert outcome == NOT_PERSISTED and int(length) == 3
        finally:
            await pusher.aclose()
            await client.aclose()


async def push_to_replicas(pusher: PersistedPusher, keys, replicas: int) -> list[tuple[object, str]]:
    args = [b"r", 1, 60_000]
    return [await pusher.push(_PUSH, [keys.requests("p"), keys.wake_list("p")], args, replicas=replicas)]


async def test_a_caller_cancelled_while_its_push_waits_leaves_the_others_their_answers(
    private_valkey, keys
) -> None:
    client = connect(private_valkey.url)  # appendfsync everysec: each WAITAOF waits ~100 ms
    pusher = PersistedPusher(client)
    args = [1, 60_000]
    try:
        pushes = [
            asyncio.create_task(
                pusher.push(_PUSH, [keys.requests("p"), keys.wake_list("p")], [f"r{i}", *args], replicas=0)
            )
            for i in range(5)
        ]
        await asyncio.sleep(0)  # the scenario: the batch is written, its WAITAOF waits for the fsync
        pushes[0].cancel()
        outcomes = await asyncio.gather(*pushes, return_exceptions=True)
    finally:
        await pusher.aclose()
        await client.aclose()
    assert isinstance(outcomes[0], asyncio.CancelledError)
    assert [outcome for _, outcome in outcomes[1:]] == [PERSISTED] * 4  # type: ignore[misc]
