"""A producer keeps enforcing the configuration it last read while Valkey has lost it (restarted empty,
a replica promoted with lag), says so, and follows the republished one."""

from __future__ import annotations

import asyncio

import pytest

from runtime.config import ProducerSettings
from runtime.errors import QueueFull, UnknownPool
from runtime.producer import Producer
from runtime.queue import groups
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from tests.support.waiting import wait_until

CALL = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
REFRESH_S = 0.05
SETTINGS = ProducerSettings(pool_registry_refresh_s=REFRESH_S)


def limited_group(max_queued: int) -> GroupConfig:
    return GroupConfig(
        group_id="g",
        policy="fifo",
        default_endpoint_url="http://127.0.0.1:9/v1",
        pools=(PoolConfig(pool_id="default", max_queued=max_queued),),
        version=1,
    )


async def read_again(producer: Producer) -> None:
    """Waits out the registry's refresh interval, so the next submit reads Valkey again."""
    await asyncio.sleep(REFRESH_S * 2)  # the scenario: time passes until the producer's copy is stale


async def queue_one(producer: Producer, sredis, keys) -> asyncio.Task:
    """A submit left waiting for its reply (no dispatcher runs), once its request is in the queue."""
    queued = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=30))
    await wait_until(lambda: sredis.llen(keys.requests("default")) == 1, what="first request queued")
    return queued


async def test_limits_and_unknown_pools_hold_while_the_configuration_is_missing(aredis, sredis, keys) -> None:
    await groups.publish(aredis, keys, limited_group(max_queued=1))
    async with Producer(aredis, keys=keys, settings=SETTINGS) as producer:
        queued = await queue_one(producer, sredis, keys)
        assert producer.configuration == "published"

        sredis.delete(keys.pool_registry(), keys.group_config("g"))  # what a Valkey restarted empty holds
        await read_again(producer)
        with pytest.raises(QueueFull):
            await producer.submit(CALL, pool_id="default", timeout=30)
        with pytest.raises(UnknownPool):
            await producer.submit(CALL, pool_id="nowhere", timeout=30)
        assert producer.configuration == "last_known" and producer.stats.config_missing_reads >= 1
        assert sredis.llen(keys.requests("default")) == 1

        await groups.publish(aredis, keys, limited_group(max_queued=2))  # republished, and changed
        await read_again(producer)
        second = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=30))
        await wait_until(lambda: sredis.llen(keys.requests("default")) == 2, what="second request queued")
        assert producer.configuration == "published"
        for task in (queued, second):
            task.cancel()
        await asyncio.gather(queued, second, return_exceptions=True)


async def test_a_lost_group_configuration_alone_is_filled_in_from_the_last_read(aredis, sredis, keys) -> None:
    await groups.publish(aredis, keys, limited_group(max_queued=1))
    async with Producer(aredis, keys=keys, settings=SETTINGS) as producer:
        queued = await queue_one(producer, sredis, keys)
        sredis.delete(keys.group_config("g"))  # the registry survived, the group's limits did not
        await read_again(producer)
        with pytest.raises(QueueFull):
            await producer.submit(CALL, pool_id="default", timeout=30)
        assert producer.configuration == "last_known"
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
