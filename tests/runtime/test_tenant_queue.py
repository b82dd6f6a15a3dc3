"""A fair pool's push, withdrawal and promoted retries against a real Valkey (issue 22, phase 2): each
tenant's own list, the enter rule of :class:`runtime.policy.tenants.TenantLedger`, the pool's count key,
per-tenant caps."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from runtime.errors import QueueFull
from runtime.policy.admission import AdmissionLimits, KeyLimits
from runtime.policy.tenants import TenantLedger
from runtime.queue import scripts
from runtime.queue.admission import KeyLease
from runtime.queue.dispatching import QueueOps, lease_member
from runtime.queue.keys import KeySpace
from runtime.queue.producing import ProducerOps
from runtime.queue.tenants import TenantPush
from runtime.wire.contract import ChatCall, Envelope, envelope_prefix

POOL = "chat"
OPEN = AdmissionLimits()


async def counters(client: aioredis.Redis, keys: KeySpace) -> dict[str, float]:
    raw = await client.hgetall(keys.tenant_counters(POOL))
    return {k.decode(): float(v) for k, v in raw.items()}


async def backlogged(client: aioredis.Redis, keys: KeySpace) -> list[tuple[str, float]]:
    return [(m.decode(), s) for m, s in await client.zrange(keys.tenants(POOL), 0, -1, withscores=True)]


async def test_a_tenants_push_goes_to_its_own_list_and_enters_it(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    ops = ProducerOps(aredis, keys)
    assert await ops.push(POOL, b"a1", OPEN, tenant=TenantPush("acme", 2.0)) == 1
    assert await ops.push(POOL, b"a2", OPEN, tenant=TenantPush("acme", 2.0)) == 2
    assert await ops.push(POOL, b"b1", OPEN, tenant=TenantPush("bolt")) == 3  # the pool's count
    assert await aredis.lrange(keys.tenant_requests(POOL, "acme"), 0, -1) == [b"a1", b"a2"]
    assert await aredis.lrange(keys.tenant_requests(POOL, "bolt"), 0, -1) == [b"b1"]
    assert await aredis.llen(keys.requests(POOL)) == 0  # nothing on the seed's list
    assert not await aredis.keys(keys.requests("*"))  # nothing a seed tool's pattern would see
    assert int(await aredis.get(keys.pool_queued(POOL))) == 3
    assert await aredis.hgetall(keys.tenant_weights(POOL)) == {b"acme": b"2.0", b"bolt": b"1.0"}
    assert await backlogged(aredis, keys) == [("acme", 0.0), ("bolt", 0.0)]
    assert await aredis.llen(keys.wake_list(POOL)) == 1


async def test_untagged_traffic_stays_on_the_seeds_list_as_tenant_star(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    ops = ProducerOps(aredis, keys)
    await ops.push(POOL, b"u1", OPEN, tenant=TenantPush(None))
    assert await aredis.lrange(keys.requests(POOL), 0, -1) == [b"u1"]
    assert await backlogged(aredis, keys) == [("*", 0.0)]


async def _pool_state(client: aioredis.Redis, keys: KeySpace) -> tuple[object, ...]:
    lists = {t: await client.lrange(keys.tenant_requests(POOL, t), 0, -1) for t in ("acme", "bolt", "*")}
    return (
        lists,
        await backlogged(client, keys),
        await counters(client, keys),
        await client.hgetall(keys.tenant_weights(POOL)),
        await client.get(keys.pool_queued(POOL)),
        await client.llen(keys.wake_list(POOL)),
        await client.hexists(keys.pool_drain(POOL), "since"),
    )


async def test_the_plain_fair_push_does_what_the_checked_one_does(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    """Without limits, lease or cap the push is ``lua/tenant_push_plain.lua``; a cap nobody reaches
    takes ``lua/tenant_push.lua``: both leave the pool in the same state."""
    other = KeySpace(prefix=keys.prefix + "checked:")
    plain, checked = ProducerOps(aredis, keys), ProducerOps(aredis, other)
    await aredis.hset(keys.tenant_counters(POOL), mapping={"bolt": 3.0, "*last": 2.0})
    await aredis.hset(other.tenant_counters(POOL), mapping={"bolt": 3.0, "*last": 2.0})
    for raw, tenant, weight in (
        (b"a1", "acme", 2.0),
        (b"b1", "bolt", 1.0),
        (b"a2", "acme", 2.0),
        (b"u", None, 1.0),
    ):
        await plain.push(POOL, raw, OPEN, tenant=TenantPush(tenant, weight))
        await checked.push(POOL, raw, OPEN, tenant=TenantPush(tenant, weight, max_queued_per_tenant=100))
    assert await _pool_state(aredis, keys) == await _pool_state(aredis, other)
    assert (await _pool_state(aredis, keys))[4] == b"4"


@pytest.mark.parametrize(
    ("stored", "waiting", "last", "expected"),
    [
        ({}, {"b": 5.0}, 0.0, 5.0),  # a newcomer starts at the lowest waiting counter
        ({"a": 9.0}, {"b": 5.0}, 0.0, 9.0),  # one that used more keeps its own, higher counter
        ({"a": 1.0}, {"b": 5.0}, 0.0, 5.0),  # time away banks no credit
        ({"a": 1.0}, {}, 7.0, 7.0),  # nobody waits: the last leaver's counter is the floor
        ({}, {}, 7.0, 7.0),
    ],
)
async def test_enter_follows_the_ledger(
    aredis: aioredis.Redis,
    keys: KeySpace,
    stored: dict[str, float],
    waiting: dict[str, float],
    last: float,
    expected: float,
) -> None:
    ledger = TenantLedger({**stored, **waiting}, waiting, last_left=last)
    assert ledger.enter("a") == expected  # the pure rule, for the same state
    await aredis.hset(keys.tenant_counters(POOL), mapping={**stored, **waiting, "*last": last})
    for tenant, counter in waiting.items():
        await aredis.zadd(keys.tenants(POOL), {tenant: counter})
    await ProducerOps(aredis, keys).push(POOL, b"a1", OPEN, tenant=TenantPush("a"))
    assert (await counters(aredis, keys))["a"] == expected
    assert await aredis.zscore(keys.tenants(POOL), "a") == expected


async def test_a_tenant_at_its_cap_is_refused_by_name_and_others_still_queue(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    ops = ProducerOps(aredis, keys)
    capped = TenantPush("acme", 1.0, max_queued_per_tenant=2)
    for raw in (b"a1", b"a2"):
        await ops.push(POOL, raw, OPEN, tenant=capped)
    with pytest.raises(QueueFull) as caught:
        await ops.push(POOL, b"a3", OPEN, tenant=capped)
    full = caught.value
    assert (full.reason, full.depth, full.limit, full.pool_id) == ("max_queued_per_tenant", 2, 2.0, POOL)
    assert "tenant 'acme' has 2 requests queued in pool 'chat'" in str(full)
    assert await aredis.llen(keys.tenant_requests(POOL, "acme")) == 2
    assert int(await aredis.get(keys.pool_queued(POOL))) == 2
    assert await aredis.hgetall(keys.rejections()) == {b"chat:max_queued_per_tenant": b"1"}
    await ops.push(POOL, b"b1", OPEN, tenant=TenantPush("bolt", 1.0, max_queued_per_tenant=2))


async def test_max_queued_counts_every_tenant_of_the_pool(aredis: aioredis.Redis, keys: KeySpace) -> None:
    ops = ProducerOps(aredis, keys)
    limits = AdmissionLimits(max_queued=3)
    for i, tenant in enumerate(("a", "b", "c")):
        await ops.push(POOL, b"r%d" % i, limits, tenant=TenantPush(tenant))
    with pytest.raises(QueueFull) as caught:
        await ops.push(POOL, b"r3", limits, tenant=TenantPush("d"))
    assert (caught.value.reason, caught.value.depth) == ("max_queued", 3)
    assert await aredis.llen(keys.tenant_requests(POOL, "d")) == 0
    assert await aredis.zscore(keys.tenants(POOL), "d") is None


async def test_racing_pushes_never_pass_the_tenants_cap(aredis: aioredis.Redis, keys: KeySpace) -> None:
    ops = ProducerOps(aredis, keys)
    push = TenantPush("acme", 1.0, max_queued_per_tenant=5)
    results = await asyncio.gather(
        *(ops.push(POOL, b"r%d" % i, OPEN, tenant=push) for i in range(20)), return_exceptions=True
    )
    assert sum(isinstance(r, QueueFull) for r in results) == 15
    assert await aredis.llen(keys.tenant_requests(POOL, "acme")) == 5


async def test_an_ingress_keys_limits_hold_in_a_fair_pool(aredis: aioredis.Redis, keys: KeySpace) -> None:
    ops = ProducerOps(aredis, keys)
    limits = KeyLimits("7", "team", max_in_flight=1)
    first = KeyLease(limits, keys.key_open("7"), f"{POOL}\x1fr1", 30.0)
    await ops.push(POOL, b"r1", OPEN, first, TenantPush("key-7"))
    assert await aredis.zcard(keys.key_open("7")) == 1
    with pytest.raises(QueueFull) as caught:
        await ops.push(POOL, b"r2", OPEN, KeyLease(limits, keys.key_open("7"), f"{POOL}\x1fr2", 30.0),
                       TenantPush("key-7"))  # fmt: skip
    assert caught.value.reason == "key_max_in_flight"
    assert await aredis.llen(keys.tenant_requests(POOL, "key-7")) == 1
    assert not await aredis.exists(keys.key_open(""))  # the placeholder of a lease-less push stays unwritten


async def test_withdrawing_the_last_request_makes_the_tenant_leave(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    ops = ProducerOps(aredis, keys)
    await aredis.hset(keys.tenant_counters(POOL), "acme", 4.5)
    raw = envelope_prefix("r1", "p1") + b"...rest"
    await ops.push(POOL, raw, OPEN, tenant=TenantPush("acme"))
    await ops.push(POOL, b"other", OPEN, tenant=TenantPush("bolt"))  # enters at acme's 4.5, the floor
    assert await ops.withdraw(POOL, "r1", "p1", raw, "g", tenant="acme")
    assert await aredis.llen(keys.tenant_requests(POOL, "acme")) == 0
    assert int(await aredis.get(keys.pool_queued(POOL))) == 1
    assert await backlogged(aredis, keys) == [("bolt", 4.5)]
    assert (await counters(aredis, keys))["*last"] == 4.5
    assert await aredis.hget(keys.counters("g"), "dropped:cancelled") == b"1"
    assert not await ops.withdraw(POOL, "r1", "p1", raw, "g", tenant="acme")  # nothing counted twice
    assert int(await aredis.get(keys.pool_queued(POOL))) == 1


def envelope(request_id: str, tenant: str | None) -> bytes:
    call = ChatCall.from_openai({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    return Envelope(request_id, "p1", POOL, call, time.time(), tenant=tenant, attempt=2).encode()


async def test_a_due_retry_goes_back_to_its_tenants_list(aredis: aioredis.Redis, keys: KeySpace) -> None:
    ops = ProducerOps(aredis, keys)
    await ops.push(POOL, b"waiting", OPEN, tenant=TenantPush("bolt"))  # bolt waits at counter 0
    await aredis.hset(keys.tenant_counters(POOL), mapping={"acme": 9.0, "bolt": 0.0})
    acme, untagged = envelope("r1", "acme"), envelope("r2", None)
    await aredis.zadd(keys.delayed(POOL), {acme: 1.0, untagged: 2.0})
    queue = QueueOps(aredis, keys, "g")
    queue.fair_pools = frozenset({POOL})
    assert await queue.promote([POOL]) == 2
    assert await aredis.lrange(keys.tenant_requests(POOL, "acme"), 0, -1) == [acme]
    assert await aredis.lrange(keys.requests(POOL), 0, -1) == [untagged]
    assert int(await aredis.get(keys.pool_queued(POOL))) == 3
    assert await backlogged(aredis, keys) == [("*", 0.0), ("bolt", 0.0), ("acme", 9.0)]
    assert await aredis.zcard(keys.delayed(POOL)) == 0


async def test_an_expired_durable_lease_requeues_onto_its_tenants_list(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    lost, untagged = envelope("r1", "acme"), envelope("r2", None)
    for request_id, raw in (("r1", lost), ("r2", untagged)):
        member = lease_member(POOL, request_id)
        await aredis.zadd(keys.group_inflight("g"), {member: 1.0})  # expired long ago
        await aredis.hset(keys.durable_leases("g"), member, raw)
    await aredis.hset(keys.tenant_counters(POOL), mapping={"acme": 7.0})
    seen = await QueueOps(aredis, keys, "g").observe([], 8, fair=[POOL])
    assert sorted(seen.requeued) == sorted([lost, untagged])
    assert await aredis.lrange(keys.tenant_requests(POOL, "acme"), 0, -1) == [lost]
    assert await aredis.lrange(keys.requests(POOL), 0, -1) == [untagged]
    assert int(await aredis.get(keys.pool_queued(POOL))) == 2
    assert await backlogged(aredis, keys) == [("*", 0.0), ("acme", 7.0)]


async def test_without_fair_pools_the_reap_requeues_as_the_seed_did(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    raw = envelope("r1", "acme")
    member = lease_member(POOL, "r1")
    await aredis.zadd(keys.group_inflight("g"), {member: 1.0})
    await aredis.hset(keys.durable_leases("g"), member, raw)
    await QueueOps(aredis, keys, "g").observe([], 8)
    assert await aredis.lrange(keys.requests(POOL), 0, -1) == [raw]  # a tagged request in an off pool
    assert not await aredis.exists(keys.pool_queued(POOL), keys.tenants(POOL))


async def test_a_shutdowns_requeue_goes_back_to_the_tenants_list(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    raw = envelope("r1", "acme")
    queue = QueueOps(aredis, keys, "g")
    queue.fair_pools = frozenset({POOL})
    code = await queue.finish(
        pool_id=POOL, producer_id="p1", member=lease_member(POOL, "r1"), reply=b"", reply_ttl_s=60,
        group_pools=[POOL], settlement=scripts.SETTLE_REQUEUE, payload=raw,
    )  # fmt: skip
    assert code == scripts.FINISH_REQUEUED
    assert await aredis.lrange(keys.tenant_requests(POOL, "acme"), 0, -1) == [raw]
    assert await aredis.llen(keys.requests(POOL)) == 0
    assert int(await aredis.get(keys.pool_queued(POOL))) == 1
    assert await backlogged(aredis, keys) == [("acme", 0.0)]
    assert await aredis.llen(keys.wake_list(POOL)) == 1  # the pool has backlog again: one dispatcher woken


async def test_the_reap_forgets_idle_tenants_at_or_below_the_floor(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    ops = ProducerOps(aredis, keys)
    await aredis.hset(
        keys.tenant_counters(POOL), mapping={"old": 3.0, "even": 5.0, "ahead": 9.0, "*last": 2.0}
    )
    await aredis.hset(keys.tenant_weights(POOL), mapping={"old": 1.0, "ahead": 2.0})
    await aredis.hset(keys.tenant_counters(POOL), "busy", 5.0)
    await ops.push(POOL, b"r1", OPEN, tenant=TenantPush("busy"))  # backlogged at 5: the floor
    await QueueOps(aredis, keys, "g").observe([], 8, fair=[POOL])
    remaining = await counters(aredis, keys)
    # Idle and at or below the floor: forgotten (they would re-enter at the floor anyway); above it,
    # or backlogged: kept; the last leaver's counter too.
    assert remaining == {"busy": 5.0, "ahead": 9.0, "*last": 2.0}
    assert await aredis.hgetall(keys.tenant_weights(POOL)) == {b"ahead": b"2.0", b"busy": b"1.0"}
    assert not await aredis.exists(keys.tenant_scan(POOL))  # one slice covered the hash: cursor back to 0
