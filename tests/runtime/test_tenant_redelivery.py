"""A fair pool's requests that leave the normal path (issue 22): dead-letter replay, burial of a durable
request requeued too often, a requeue's charge, and leftover tenant lists of a pool switched off before
a dispatcher started. Real Valkey, the simulator over HTTP, dispatchers in this process or their own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import replace

import pytest

from runtime.dispatch import deadletters
from runtime.dispatch.redelivery import requeued
from runtime.policy.admission import AdmissionLimits
from runtime.policy.tenants import TenantCost
from runtime.policy.tokens import estimate_tokens
from runtime.producer import Producer
from runtime.queue import groups
from runtime.queue.dispatching import ClaimRequest, QueueOps, lease_member
from runtime.queue.leases import LeaseRecord
from runtime.queue.producing import ProducerOps
from runtime.queue.tenant_dispatch import FairPick
from runtime.queue.tenants import TenantPush
from runtime.wire.contract import ChatCall, Envelope
from tests.runtime.test_tenant_dispatch import POOL, call, one_fair_pool
from tests.support.dispatcher_process import start_dispatchers, stop_dispatcher
from tests.support.dispatching import running_dispatcher, wait_until

OPEN = AdmissionLimits()


def envelope(request_id: str, tenant: str | None, *, latency_ms: float = 0, user: str = "") -> Envelope:
    body = {**call(request_id, latency_ms=latency_ms), **({"user": user} if user else {})}
    return Envelope(request_id, "p1", POOL, ChatCall.from_openai(body), time.time(), tenant=tenant)


def durable(config, **pool: object):  # type: ignore[no-untyped-def]
    return replace(config, delivery="durable", pools=(replace(config.pools[0], **pool),))


async def test_a_replayed_dead_letter_goes_back_to_its_tenants_list(aredis, sredis, keys) -> None:
    env = envelope("r1", "key-7")
    letter = deadletters.DeadLetter(
        env.encode(), "r1", POOL, "attempts_exhausted", "backend_error", "boom", 3, time.time()
    )
    await aredis.rpush(keys.dead_letters(POOL), letter.encode())
    [stored] = deadletters.dead_letters(sredis, keys, POOL)

    assert deadletters.replay(sredis, keys, POOL, stored, fair=True)

    [queued] = await aredis.lrange(keys.tenant_requests(POOL, "key-7"), 0, -1)
    assert Envelope.decode(queued).request_id == "r1" and Envelope.decode(queued).tenant == "key-7"
    assert await aredis.llen(keys.requests(POOL)) == 0  # not served as tenant '*'
    assert int(await aredis.get(keys.pool_queued(POOL))) == 1
    assert await aredis.zscore(keys.tenants(POOL), "key-7") == 0.0  # entered at the floor
    assert await aredis.llen(keys.dead_letters(POOL)) == 0
    assert not deadletters.replay(sredis, keys, POOL, stored, fair=True)  # taken once


async def test_an_untagged_dead_letter_replayed_in_a_fair_pool_is_counted_as_tenant_star(
    aredis, sredis, keys
) -> None:
    await ProducerOps(aredis, keys).push(POOL, envelope("u0", None).encode(), OPEN, tenant=TenantPush(None))
    letter = deadletters.DeadLetter(
        envelope("u1", None).encode(),
        "u1",
        POOL,
        "attempts_exhausted",
        "backend_error",
        "boom",
        3,
        time.time(),
    )
    await aredis.rpush(keys.dead_letters(POOL), letter.encode())
    [stored] = deadletters.dead_letters(sredis, keys, POOL)

    assert deadletters.replay(sredis, keys, POOL, stored, fair=True)

    assert await aredis.llen(keys.requests(POOL)) == 2
    assert int(await aredis.get(keys.pool_queued(POOL))) == 2  # both counted: '*' was already backlogged


async def test_a_durable_request_requeued_too_often_at_a_tenants_head_is_buried(aredis, keys, sim) -> None:
    config = durable(one_fair_pool(sim.url, "tokens", slots=1), max_requeues=1)
    await groups.publish(aredis, keys, config)
    worn = envelope("worn", "key-a", user="worn")
    for _ in range(2):  # put back by two expired leases: one more than the pool allows
        worn = requeued(worn)
    await ProducerOps(aredis, keys).push(POOL, worn.encode(), OPEN, tenant=TenantPush("key-a"))
    async with (
        Producer(aredis, keys=keys) as producer,
        running_dispatcher(aredis, keys, config, concurrency=1),
    ):
        # key-b's call queued behind the buried one: the pool goes on serving its other tenants.
        result = await asyncio.wait_for(
            producer.submit(call("b", latency_ms=0), pool_id=POOL, timeout=30, tenant="key-b"), 30
        )
    assert result.completion["choices"]
    [letter] = await aredis.lrange(keys.dead_letters(POOL), 0, -1)
    assert deadletters.DeadLetter.decode(letter).request_id == "worn"
    assert await aredis.llen(keys.tenant_requests(POOL, "key-a")) == 0
    assert await aredis.zscore(keys.tenants(POOL), "key-a") is None  # it left with its list empty
    assert int(await aredis.get(keys.pool_queued(POOL))) == 0
    assert sim.calls_by_user["worn"] == 0  # never run


@pytest.mark.slow
async def test_a_durable_call_requeued_after_its_dispatcher_died_is_charged_once(
    aredis, keys, sim, valkey_url
) -> None:
    config = durable(replace(one_fair_pool(sim.url, "tokens", slots=1), group_id="tenants-requeue"))
    await groups.publish(aredis, keys, config)
    cost = TenantCost()
    body = call("first", latency_ms=3000)
    estimate = cost.of(*estimate_tokens(body["messages"], {"max_tokens": 16}, 256))
    async with Producer(aredis, keys=keys) as producer:
        first = asyncio.create_task(
            producer.submit({**body, "user": "first"}, pool_id=POOL, timeout=60, tenant="key-a")
        )
        # A second call of the same tenant keeps it backlogged (its counter stays its score).
        second = asyncio.create_task(
            producer.submit({**call("second", latency_ms=0), "user": "second"}, pool_id=POOL, timeout=60,
                            tenant="key-a")
        )  # fmt: skip
        await wait_until(lambda: aredis.llen(keys.tenant_requests(POOL, "key-a")), timeout=10, what="queued")
        [doomed] = await start_dispatchers(
            valkey_url, keys.prefix, "tenants-requeue", ["doomed"], concurrency=1, lease_s=2.0
        )
        try:
            await wait_until(lambda: sim.calls_by_user["first"] == 1, timeout=20, what="the first attempt")
            assert await aredis.zscore(keys.tenants(POOL), "key-a") == pytest.approx(estimate)
            doomed.kill()  # SIGKILL mid-call: its lease expires and the reap puts the call back
            doomed.wait(10)
        finally:
            stop_dispatcher(doomed)
        async with running_dispatcher(aredis, keys, config, concurrency=1, lease_s=2.0):
            await wait_until(lambda: sim.calls_by_user["first"] == 2, timeout=20, what="the requeued attempt")
            # The second attempt was charged nothing: the first attempt's charge stands for it.
            assert await aredis.zscore(keys.tenants(POOL), "key-a") == pytest.approx(estimate)
            done = [await asyncio.wait_for(task, 30) for task in (first, second)]
    # What key-a was served: each call's usage, the requeued one's once (its killed attempt never ended).
    served = sum(cost.of(r.completion["usage"]["prompt_tokens"], r.completion["usage"]["completion_tokens"])
                 for r in done)  # fmt: skip
    assert float(await aredis.hget(keys.tenant_served(POOL), "key-a")) == pytest.approx(served)


async def test_a_dispatcher_started_after_fairness_was_switched_off_drains_the_tenants_lists(
    aredis, keys, sim
) -> None:
    fair = one_fair_pool(sim.url, "tokens", slots=2)
    await groups.publish(aredis, keys, fair)
    async with Producer(aredis, keys=keys) as producer:
        queued = [
            asyncio.create_task(
                producer.submit(call(f"{i}", latency_ms=0), pool_id=POOL, timeout=60, tenant=f"key-{i % 3}")
            )
            for i in range(6)
        ]
        await wait_until(lambda: _queued(aredis, keys, 6), timeout=10, what="all six queued")
        off = dataclasses.replace(fair, version=2, pools=(replace(fair.pools[0], tenant_fairness="off"),))
        async with running_dispatcher(aredis, keys, off, concurrency=2):  # it never saw the pool fair
            results = await asyncio.wait_for(asyncio.gather(*queued), 30)
    assert all(r.completion["choices"] for r in results)
    assert int(await aredis.get(keys.pool_queued(POOL))) == 0
    assert not await aredis.keys(f"{keys.prefix}list:llm:tenant-requests:*")


async def _queued(aredis, keys, n: int) -> bool:  # type: ignore[no-untyped-def]
    return int(await aredis.get(keys.pool_queued(POOL)) or 0) >= n


async def _claim_durable(queue, keys, env: Envelope, charge: float) -> str:  # type: ignore[no-untyped-def]
    """A durable launch of ``env`` from its tenant's list, charged ``charge``; its fencing token."""
    raw = env.encode()
    await ProducerOps(queue.client, keys).push(POOL, raw, OPEN, tenant=TenantPush(env.tenant))
    queue.fair_pools = frozenset({POOL})
    queue.fair_picks.setdefault(POOL, {})[raw] = FairPick(str(env.tenant), charge, 10, 16, 2.0)
    record = LeaseRecord.of(env, pool_id=POOL, claimed_at=time.time(), dispatcher_id="d1", cost=1).encode()
    request = ClaimRequest(
        POOL, raw, "launch", lease_member=lease_member(POOL, env.request_id), producer_id="p1", pool_max=8,
        group_limit=8, lease_record=record, requeue=requeued(env).encode(),
    )  # fmt: skip
    [(code, _, token)] = await queue.claim([request], 30.0)
    assert code == "claimed" and token
    return token


async def test_the_finish_corrects_the_charge_and_a_stale_finish_corrects_nothing(aredis, keys) -> None:
    await aredis.set(keys.producer_alive("p1"), b"1", ex=60)
    queue = QueueOps(aredis, keys, "g")
    first, second = envelope("c1", "acme"), envelope("c2", "acme")
    token = await _claim_durable(queue, keys, first, 50.0)
    member = lease_member(POOL, "c1")
    queue.stage_correction(member, -40.0, 60.0)  # used 40 less than estimated (weight 2: -20)
    assert await queue.finish(pool_id=POOL, producer_id="p1", member=member, reply=b"r", reply_ttl_s=10.0,
                              token=token) == 1  # fmt: skip
    assert float(await aredis.hget(keys.tenant_counters(POOL), "acme")) == pytest.approx(30.0)
    assert float(await aredis.hget(keys.tenant_served(POOL), "acme")) == pytest.approx(60.0)

    stale = await _claim_durable(queue, keys, second, 50.0)
    member = lease_member(POOL, "c2")
    await aredis.zadd(keys.group_inflight("g"), {member: 1.0})  # its lease expired long ago
    await QueueOps(aredis, keys, "g").observe([], 8, fair=[POOL])  # another dispatcher's reap requeues it
    # Back from idle at the last leaver's counter (50, its own was 30), then charged 50.
    assert await aredis.zscore(keys.tenants(POOL), "acme") == pytest.approx(100.0)
    queue.stage_correction(member, -40.0, 60.0)
    assert await queue.finish(pool_id=POOL, producer_id="p1", member=member, reply=b"r", reply_ttl_s=10.0,
                              token=stale) == -1  # fmt: skip
    # The requeued copy will be corrected by the FINISH of the attempt that runs it, not by this one.
    assert float(await aredis.hget(keys.tenant_counters(POOL), "acme")) == pytest.approx(100.0)
    assert await aredis.zscore(keys.tenants(POOL), "acme") == pytest.approx(100.0)
    assert float(await aredis.hget(keys.tenant_served(POOL), "acme")) == pytest.approx(60.0)
    assert await aredis.llen(keys.tenant_requests(POOL, "acme")) == 1  # the requeued copy
