"""``Producer.submit(..., tenant=...)`` and ``stream(..., tenant=...)`` against a real Valkey (issue 22):
a fair pool queues on the tenant's list, an ``off`` pool exactly as before."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from runtime.errors import MalformedEnvelope, QueueFull
from runtime.producer import Producer
from runtime.queue import groups
from runtime.wire.contract import Envelope
from runtime.wire.groupconfig import PoolConfig
from tests.support.dispatching import CALL, one_pool_group, wait_until

NO_BACKEND = "http://127.0.0.1:9/v1"  # nothing listens: no dispatcher runs in these tests


def fair_group(**pool: object):  # type: ignore[no-untyped-def]
    return replace(
        one_pool_group(NO_BACKEND), pools=(PoolConfig("default", tenant_fairness="tokens", **pool),)
    )


async def test_a_fair_pools_submit_queues_on_its_tenants_list(aredis, keys) -> None:
    await groups.publish(aredis, keys, fair_group(max_queued_per_tenant=1))
    async with Producer(aredis, keys=keys) as producer:
        first = asyncio.create_task(
            producer.submit(CALL, pool_id="default", timeout=30, tenant="key-7", tenant_weight=3.0)
        )
        tenant_list = keys.tenant_requests("default", "key-7")
        await wait_until(lambda: aredis.llen(tenant_list), timeout=5)
        [raw] = await aredis.lrange(tenant_list, 0, -1)
        assert Envelope.decode(raw).tenant == "key-7"
        assert await aredis.hget(keys.tenant_weights("default"), "key-7") == b"3.0"
        with pytest.raises(QueueFull) as caught:
            await producer.submit(CALL, pool_id="default", timeout=30, tenant="key-7")
        assert caught.value.reason == "max_queued_per_tenant" and "tenant 'key-7'" in str(caught.value)
        assert producer.stats.rejected == 1
        untagged = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=30))
        await wait_until(lambda: aredis.llen(keys.requests("default")), timeout=5)
        assert await aredis.zrange(keys.tenants("default"), 0, -1) == [b"*", b"key-7"]
        first.cancel()  # withdrawn from its tenant's list: the tenant leaves, the count follows
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await aredis.llen(tenant_list) == 0
        assert await aredis.zrange(keys.tenants("default"), 0, -1) == [b"*"]
        assert int(await aredis.get(keys.pool_queued("default"))) == 1
        untagged.cancel()
        with pytest.raises(asyncio.CancelledError):
            await untagged
        assert int(await aredis.get(keys.pool_queued("default"))) == 0
        assert await aredis.zcard(keys.tenants("default")) == 0


async def test_a_fair_pools_stream_queues_on_its_tenants_list_and_withdraws_from_it(aredis, keys) -> None:
    await groups.publish(aredis, keys, fair_group())
    async with Producer(aredis, keys=keys) as producer:

        async def consume() -> None:
            async for _ in producer.stream(CALL, pool_id="default", timeout=30, tenant="key-9"):
                pass

        task = asyncio.create_task(consume())
        tenant_list = keys.tenant_requests("default", "key-9")
        await wait_until(lambda: aredis.llen(tenant_list), timeout=5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await aredis.llen(tenant_list) == 0
        assert int(await aredis.get(keys.pool_queued("default"))) == 0


async def test_an_off_pool_queues_a_tagged_request_as_the_seed_did(aredis, keys) -> None:
    await groups.publish(aredis, keys, one_pool_group(NO_BACKEND))
    async with Producer(aredis, keys=keys) as producer:
        task = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=30, tenant="key-7"))
        await wait_until(lambda: aredis.llen(keys.requests("default")), timeout=5)
        [raw] = await aredis.lrange(keys.requests("default"), 0, -1)
        assert Envelope.decode(raw).tenant == "key-7"  # carried for history, not for scheduling
        assert not await aredis.keys(f"{keys.prefix}*tenant*")
        assert not await aredis.exists(keys.pool_queued("default"), keys.tenants("default"))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await aredis.llen(keys.requests("default")) == 0


async def test_a_malformed_tenant_or_weight_is_refused_before_any_push(aredis, keys) -> None:
    await groups.publish(aredis, keys, fair_group())
    async with Producer(aredis, keys=keys) as producer:
        with pytest.raises(MalformedEnvelope, match="tenant"):
            await producer.submit(CALL, pool_id="default", timeout=5, tenant="has space")
        with pytest.raises(ValueError, match="weight"):
            await producer.submit(CALL, pool_id="default", timeout=5, tenant="ok", tenant_weight=0)
    assert not await aredis.exists(keys.pool_queued("default"))
