"""Admission control against a real Valkey: the check and the push are one step, even under races."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.backends.breaker import OPEN, BreakerState, encode_state
from runtime.errors import QueueFull, Rejected
from runtime.policy.admission import DRAIN_WINDOW_S, AdmissionLimits, KeyLimits, decide, decide_key
from runtime.queue import scripts
from runtime.queue.admission import ADMIT_PUSH, DRAIN_RING, KeyLease, KeyLeases, admit_and_push
from runtime.queue.dispatching import lease_member
from runtime.queue.keys import KeySpace
from runtime.valkey.client import connect


async def seed_drain_rate(client: aioredis.Redis, keys: KeySpace, pool_id: str, per_second: int) -> float:
    """Fills the pool's drain ring as if ``per_second`` requests left in each of the last seconds.

    Buckets two or more seconds old are written, so a second ticking over during the test changes
    nothing but which bucket is newest; returns the rate the script will measure.
    """
    now = int((await client.time())[0])
    seconds = range(now - DRAIN_WINDOW_S + 2, now - 1)  # within the window for the next two seconds
    mapping: dict[str, int] = {}
    for sec in seconds:
        mapping[f"s{sec % DRAIN_RING}"] = sec
        mapping[f"c{sec % DRAIN_RING}"] = per_second
    await client.hset(keys.pool_drain(pool_id), mapping=mapping)
    return per_second * len(seconds) / DRAIN_WINDOW_S


async def test_a_full_pool_refuses_at_once_and_queues_nothing(aredis: aioredis.Redis, keys: KeySpace) -> None:
    script = aredis.register_script(ADMIT_PUSH)
    limits = AdmissionLimits(max_queued=3)
    for i in range(3):
        assert await admit_and_push(script, keys, "backfill", b"r%d" % i, limits) == i + 1
    with pytest.raises(QueueFull) as caught:
        await admit_and_push(script, keys, "backfill", b"r3", limits)
    full = caught.value
    assert isinstance(full, Rejected) and full.error_type == "queue_full" and full.retryable
    assert (full.pool_id, full.reason, full.depth, full.limit) == ("backfill", "max_queued", 3, 3)
    assert full.retry_after_s == 1.0  # no drain measured yet: the rule's default hint
    assert "pool 'backfill' is full: 3 requests queued, max_queued is 3" in str(full)
    assert await aredis.lrange(keys.requests("backfill"), 0, -1) == [b"r0", b"r1", b"r2"]
    assert await aredis.hgetall(keys.rejections()) == {b"backfill:max_queued": b"1"}


async def test_estimated_wait_refuses_on_the_measured_drain_rate(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    script = aredis.register_script(ADMIT_PUSH)
    rate = await seed_drain_rate(aredis, keys, "docs", 4)
    await aredis.rpush(keys.requests("docs"), *[b"x"] * 20)
    wait = 20 / rate
    with pytest.raises(QueueFull) as caught:
        await admit_and_push(script, keys, "docs", b"new", AdmissionLimits(max_queue_wait_s=wait * 0.8))
    assert caught.value.reason == "max_queue_wait" and caught.value.depth == 20
    assert caught.value.retry_after_s == pytest.approx(wait * 0.2)
    assert (
        await admit_and_push(script, keys, "docs", b"new", AdmissionLimits(max_queue_wait_s=wait * 1.2)) == 21
    )
    assert await aredis.hgetall(keys.rejections()) == {b"docs:max_queue_wait": b"1"}


async def test_drain_counts_land_in_the_current_seconds_bucket(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    key = keys.pool_drain("p")
    record = aredis.register_script(scripts.DRAIN)
    for _ in range(3):
        await record(keys=[key], args=[2])
    fields = {k.decode(): v for k, v in (await aredis.hgetall(key)).items()}
    last = float(fields.pop("last"))  # when a request last left: admission's stall clock
    ring = {k: int(v) for k, v in fields.items()}
    assert sum(v for k, v in ring.items() if k.startswith("c")) == 6
    assert len(ring) <= 2 * DRAIN_RING and await aredis.ttl(key) > 0
    assert abs(last - float((await aredis.time())[0])) < 2


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    depth=st.integers(0, 60),
    max_queued=st.none() | st.integers(1, 60),
    max_wait=st.none() | st.floats(0.5, 30),
    per_second=st.integers(0, 8),
)
async def test_the_script_agrees_with_the_pure_rule(
    valkey_url: str,
    keys: KeySpace,
    depth: int,
    max_queued: int | None,
    max_wait: float | None,
    per_second: int,
) -> None:
    client = connect(valkey_url)
    try:
        pool = f"p{depth}-{max_queued}-{per_second}"
        await client.delete(keys.requests(pool), keys.pool_drain(pool))
        rate = await seed_drain_rate(client, keys, pool, per_second)
        if depth:
            await client.rpush(keys.requests(pool), *[b"x"] * depth)
        limits = AdmissionLimits(max_queued=max_queued, max_queue_wait_s=max_wait)
        expected = decide(depth, limits, rate)
        try:
            await admit_and_push(client.register_script(ADMIT_PUSH), keys, pool, b"new", limits)
        except QueueFull as full:
            assert expected is not None and (full.reason, full.depth) == (expected.reason, depth)
            assert full.retry_after_s == pytest.approx(expected.retry_after_s)
            assert await client.llen(keys.requests(pool)) == depth
        else:
            assert expected is None
            assert await client.llen(keys.requests(pool)) == depth + 1
    finally:
        await client.aclose()


async def test_racing_producers_never_take_the_queue_past_max_queued(valkey_url: str, keys: KeySpace) -> None:
    """Eight producers on their own connections race one consumer; a watcher samples the depth."""
    limits = AdmissionLimits(max_queued=20)
    clients = [connect(valkey_url) for _ in range(10)]
    queue = keys.requests("hot")
    admitted, refused, popped, depths = [0], [0], [0], []
    done = asyncio.Event()

    async def produce(client: aioredis.Redis, n: int) -> None:
        script = client.register_script(ADMIT_PUSH)
        for i in range(n):
            try:
                await admit_and_push(script, keys, "hot", b"%d" % i, limits)
                admitted[0] += 1
            except QueueFull:
                refused[0] += 1

    async def consume(client: aioredis.Redis) -> None:
        while not done.is_set():
            if await client.lpop(queue) is not None:
                popped[0] += 1

    async def watch(client: aioredis.Redis) -> None:
        while not done.is_set():
            depths.append(await client.llen(queue))

    try:
        helpers = [asyncio.create_task(consume(clients[8])), asyncio.create_task(watch(clients[9]))]
        await asyncio.gather(*(produce(c, 150) for c in clients[:8]))
        done.set()
        await asyncio.gather(*helpers)
        final = await clients[0].llen(queue)
        assert admitted[0] + refused[0] == 8 * 150
        assert refused[0] > 0 and admitted[0] - popped[0] == final <= 20
        assert max(depths) <= 20 and len(depths) > 10
        counted = await clients[0].hget(keys.rejections(), "hot:max_queued")
        assert int(counted or 0) == refused[0]
    finally:
        for client in clients:
            await client.aclose()


async def valkey_now(client: aioredis.Redis) -> float:
    seconds, micros = await client.time()
    return seconds + micros / 1e6


@pytest.mark.parametrize(("last_drain_ago", "refused"), [(None, True), (12.0, True), (2.0, False)])
async def test_backlog_that_drains_nothing_past_max_queue_wait_is_refused(
    aredis: aioredis.Redis, keys: KeySpace, last_drain_ago: float | None, refused: bool
) -> None:
    """The dispatchers are down (or stuck): nothing has left the queue since its backlog began."""
    script = aredis.register_script(ADMIT_PUSH)
    limits = AdmissionLimits(max_queue_wait_s=5.0)
    assert await admit_and_push(script, keys, "stuck", b"first", limits) == 1  # the backlog starts now
    now = await valkey_now(aredis)
    drained = {} if last_drain_ago is None else {"last": now - last_drain_ago}
    # As if the backlog began 20 s ago (admission wrote ``since``; the claims write ``last``).
    await aredis.hset(keys.pool_drain("stuck"), mapping={"since": now - 20, **drained})
    if not refused:
        assert await admit_and_push(script, keys, "stuck", b"second", limits) == 2
        return
    with pytest.raises(QueueFull) as caught:
        await admit_and_push(script, keys, "stuck", b"second", limits)
    full = caught.value
    assert (full.reason, full.depth, full.limit, full.retry_after_s) == ("not_draining", 1, 5.0, 5.0)
    idle = 20 if last_drain_ago is None else last_drain_ago  # from the later of backlog start and drain
    assert f"has drained nothing for {idle:.0f}s" in str(full) and "the wait is unbounded" in str(full)
    assert await aredis.lrange(keys.requests("stuck"), 0, -1) == [b"first"]
    assert await aredis.hgetall(keys.rejections()) == {b"stuck:not_draining": b"1"}


async def test_a_paused_pool_with_max_queue_wait_refuses_even_when_empty(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    script = aredis.register_script(ADMIT_PUSH)
    with pytest.raises(QueueFull) as caught:
        await admit_and_push(script, keys, "held", b"r", AdmissionLimits(max_queue_wait_s=30.0, paused=True))
    assert caught.value.reason == "paused" and "pool 'held' is paused" in str(caught.value)
    assert await aredis.llen(keys.requests("held")) == 0
    # Paused but unbounded by choice (no max_queue_wait_s): it queues, as before.
    assert await admit_and_push(script, keys, "held", b"r", AdmissionLimits(max_queued=10, paused=True)) == 1
    assert await aredis.hgetall(keys.rejections()) == {b"held:paused": b"1"}


@pytest.mark.parametrize(("opened_ago", "refused"), [(1.0, True), (11.0, False)])
async def test_an_open_breaker_refuses_until_it_may_probe(
    aredis: aioredis.Redis, keys: KeySpace, opened_ago: float, refused: bool
) -> None:
    """The state as the fleet's shared breaker stores it; after its open time it probes: admitted."""
    script = aredis.register_script(ADMIT_PUSH)
    state = BreakerState(mode=OPEN, since=await valkey_now(aredis) - opened_ago, trips=1)
    await aredis.set(keys.backend_breaker("gpu"), encode_state(state))
    limits = AdmissionLimits(max_queue_wait_s=30.0, breaker_backend_id="gpu", breaker_open_s=10.0)
    if not refused:
        assert await admit_and_push(script, keys, "behind", b"r", limits) == 1
        return
    with pytest.raises(QueueFull) as caught:
        await admit_and_push(script, keys, "behind", b"r", limits)
    assert caught.value.reason == "breaker_open" and "circuit breaker open" in str(caught.value)
    assert await aredis.hgetall(keys.rejections()) == {b"behind:breaker_open": b"1"}


def key_lease(
    keys: KeySpace, limits: KeyLimits, pool_id: str, request_id: str, seconds: float = 30.0
) -> KeyLease:
    return KeyLease(limits, keys.key_open(limits.key_id), lease_member(pool_id, request_id), seconds)


async def test_a_keys_open_and_queued_requests_are_counted_with_the_push(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    script = aredis.register_script(ADMIT_PUSH)
    unbounded = AdmissionLimits()
    key = KeyLimits("7", "alice", max_in_flight=3, max_queued=2)
    for i in range(2):
        await admit_and_push(
            script, keys, "gold", b"r%d" % i, unbounded, key_lease(keys, key, "gold", f"r{i}")
        )
    with pytest.raises(QueueFull) as caught:
        await admit_and_push(script, keys, "gold", b"r2", unbounded, key_lease(keys, key, "gold", "r2"))
    assert (caught.value.reason, caught.value.depth, caught.value.limit) == ("key_max_queued", 2, 2)
    assert "key 'alice' has 2 requests queued, its most queued (max_queued) is 2" in str(caught.value)
    # r0 starts (a dispatcher's lease in its pool): one queued, so one more may queue, up to three open.
    await aredis.zadd(keys.pool_inflight("gold"), {lease_member("gold", "r0"): 1e12})
    await admit_and_push(script, keys, "gold", b"r2", unbounded, key_lease(keys, key, "gold", "r2"))
    with pytest.raises(QueueFull) as caught:
        await admit_and_push(script, keys, "gold", b"r3", unbounded, key_lease(keys, key, "gold", "r3"))
    assert (caught.value.reason, caught.value.depth) == ("key_max_in_flight", 3)
    assert await aredis.llen(keys.requests("gold")) == 3
    assert await aredis.hgetall(keys.rejections()) == {
        b"gold:key_max_queued": b"1",
        b"gold:key_max_in_flight": b"1",
    }


async def test_a_keys_lease_lapses_unless_renewed(aredis: aioredis.Redis, keys: KeySpace) -> None:
    """A producer that dies stops renewing: its key's requests stop counting after one lease."""
    script = aredis.register_script(ADMIT_PUSH)
    key = KeyLimits("8", "bob", max_in_flight=1)
    leases = KeyLeases(aredis, keys, ttl_s=0.3)
    first = leases.lease(key, lease_member("gold", "a"), timeout_s=60.0)
    await admit_and_push(script, keys, "gold", b"a", AdmissionLimits(), first)
    leases.hold(first, 60.0)
    for _ in range(3):  # renewed past its first lease: still counted
        await asyncio.sleep(0.2)  # the scenario: time passes within each lease, then it is renewed
        await leases.renew()
    with pytest.raises(QueueFull):
        await admit_and_push(script, keys, "gold", b"b", AdmissionLimits(), key_lease(keys, key, "gold", "b"))
    await asyncio.sleep(0.4)  # no renewal: lapsed
    await admit_and_push(
        script, keys, "gold", b"b", AdmissionLimits(), key_lease(keys, key, "gold", "b", 60.0)
    )
    await leases.release(first)
    assert await aredis.zrange(keys.key_open("8"), 0, -1) == [lease_member("gold", "b").encode()]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    running=st.integers(0, 4),
    queued=st.integers(0, 4),
    max_in_flight=st.none() | st.integers(1, 6),
    max_queued=st.none() | st.integers(1, 6),
)
async def test_the_key_check_agrees_with_the_pure_rule(
    valkey_url: str,
    keys: KeySpace,
    running: int,
    queued: int,
    max_in_flight: int | None,
    max_queued: int | None,
) -> None:
    client = connect(valkey_url)
    try:
        key = KeyLimits(f"k{running}-{queued}-{max_in_flight}-{max_queued}", "k", max_in_flight, max_queued)
        await client.delete(keys.key_open(key.key_id), keys.pool_inflight("kp"), keys.requests("kp"))
        started = [lease_member("kp", f"run{i}") for i in range(running)]
        waiting = [lease_member("kp", f"wait{i}") for i in range(queued)]
        if started or waiting:
            await client.zadd(keys.key_open(key.key_id), dict.fromkeys(started + waiting, 1e12))
        if started:
            await client.zadd(keys.pool_inflight("kp"), dict.fromkeys(started, 1e12))
        expected = decide_key(running + queued, queued, key)
        lease = key_lease(keys, key, "kp", "new")
        try:
            await admit_and_push(
                client.register_script(ADMIT_PUSH), keys, "kp", b"new", AdmissionLimits(), lease
            )
        except QueueFull as full:
            assert full.reason == expected
        else:
            assert expected is None
            assert await client.zscore(keys.key_open(key.key_id), lease.member) is not None
    finally:
        await client.aclose()
