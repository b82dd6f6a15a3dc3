"""Fairness between the tenants of one pool with real Valkey, real dispatchers and the simulator over
HTTP (issue 22, phase 2): a noisy neighbour, charges and their correction from ``usage`` (or none), a
tenant back from idle, two dispatcher processes on one pool's tenants."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from aiohttp import web

from runtime.policy.tenants import TenantCost
from runtime.policy.tokens import estimate_tokens
from runtime.producer import Producer
from runtime.queue import groups
from runtime.queue.dispatching import lease_member
from runtime.queue.leases import LeaseRecord
from runtime.telemetry import semconv
from runtime.wire.contract import ChatCall, Envelope
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatcher_process import start_dispatcher
from tests.support.dispatching import running_dispatcher, wait_until

POOL = "chat"


def one_fair_pool(url: str, fairness: str, *, slots: int = 2, **pool: object) -> GroupConfig:
    return GroupConfig(
        group_id="tenants",
        policy="drr",
        total_concurrency=slots,
        default_endpoint_url=url,
        version=1,
        pools=(PoolConfig(POOL, max_concurrent=slots, tenant_fairness=fairness, **pool),),  # type: ignore[arg-type]
    )


def call(text: str, latency_ms: float = 40, max_tokens: int = 16) -> dict:
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "sim": {"latency_ms": latency_ms},
    }


async def queued(client, keys, n: int) -> None:  # type: ignore[no-untyped-def]
    async def enough() -> bool:
        return (
            int(await client.get(keys.pool_queued(POOL)) or 0) + await client.llen(keys.requests(POOL)) >= n
        )

    await wait_until(enough, timeout=20, what=f"{n} calls queued")


async def noisy_neighbour(aredis, keys, sim, fairness: str) -> int:  # type: ignore[no-untyped-def]
    """Tenant A queues 30 calls, then tenant B 3 (2 slots): how many of A's finished before B's last."""
    config = one_fair_pool(sim.url, fairness)
    await groups.publish(aredis, keys, config)
    order: list[str] = []

    async def submit(producer: Producer, tenant: str, i: int) -> None:
        await producer.submit(call(f"{tenant} {i}"), pool_id=POOL, timeout=60, tenant=tenant)
        order.append(tenant)

    async with Producer(aredis, keys=keys) as producer:
        noisy = [asyncio.create_task(submit(producer, "key-a", i)) for i in range(30)]
        await queued(aredis, keys, 30)
        async with running_dispatcher(aredis, keys, config, concurrency=2):
            await wait_until(lambda: len(order) >= 2, timeout=20, what="A's first calls")
            quiet = [asyncio.create_task(submit(producer, "key-b", i)) for i in range(3)]
            await asyncio.wait_for(asyncio.gather(*quiet), 30)
            a_before = order.count("key-a")
            await asyncio.wait_for(asyncio.gather(*noisy), 60)
    return a_before


async def test_a_quiet_tenant_waits_for_a_slot_not_behind_a_noisy_ones_backlog(aredis, keys, sim) -> None:
    a_before = await noisy_neighbour(aredis, keys, sim, "tokens")
    # B enters at A's counter: from then on they alternate. A finished what was running or launched
    # before B queued, then one per B call; never its backlog of 30.
    assert a_before <= 12, f"{a_before} of A's calls finished before B's last"
    assert await aredis.zcard(keys.tenants(POOL)) == 0
    assert int(await aredis.get(keys.pool_queued(POOL))) == 0


async def test_with_fairness_off_the_quiet_tenant_waits_behind_the_backlog(aredis, keys, sim) -> None:
    a_before = await noisy_neighbour(aredis, keys, sim, "off")
    assert a_before >= 28, f"only {a_before} of A's calls finished before B's last"
    assert not await aredis.exists(keys.tenants(POOL), keys.pool_queued(POOL))


async def test_charges_follow_usage_and_weights(aredis, keys, sim) -> None:
    config = one_fair_pool(sim.url, "tokens", slots=1)
    async with (
        Producer(aredis, keys=keys) as producer,
        running_dispatcher(aredis, keys, config, concurrency=1) as dispatcher,
    ):
        done = await producer.submit(call("x" * 40, latency_ms=0), pool_id=POOL, timeout=30, tenant="key-1")
        usage = done.completion["usage"]
        second = await producer.submit(
            call("x" * 40, latency_ms=0), pool_id=POOL, timeout=30, tenant="key-2", tenant_weight=2.0
        )
        usage_2 = second.completion["usage"]
        await wait_until(lambda: not dispatcher.queue.charges, timeout=10, what="corrections sent")
    # Idle tenants' counters at the floor may already be forgotten (the reap's cleanup): what they were
    # served, and the last leaver's counter, are kept.
    served = {k.decode(): float(v) for k, v in (await aredis.hgetall(keys.tenant_served(POOL))).items()}
    last = float(await aredis.hget(keys.tenant_counters(POOL), "*last"))
    # Charged the estimate at launch, corrected to the usage the simulator reported: 1 x input + 4 x output.
    actual = 1.0 * usage["prompt_tokens"] + 4.0 * usage["completion_tokens"]
    actual_2 = 1.0 * usage_2["prompt_tokens"] + 4.0 * usage_2["completion_tokens"]
    assert served == pytest.approx({"key-1": actual, "key-2": actual_2})
    # key-1 left the backlog at its launch, charged its estimate: that is the floor key-2 entered at;
    # then key-2 paid half as much per token: it left at its own launch with half its estimate on top.
    estimate = TenantCost().of(*estimate_tokens(call("x" * 40)["messages"], {"max_tokens": 16}, 256))
    assert last == pytest.approx(estimate + estimate / 2)


async def test_requests_mode_charges_one_per_request(aredis, keys, sim) -> None:
    config = replace(one_fair_pool(sim.url, "requests", slots=1))
    async with (
        Producer(aredis, keys=keys) as producer,
        running_dispatcher(aredis, keys, config, concurrency=1) as dispatcher,
    ):
        for _ in range(3):
            await producer.submit(call("hi", latency_ms=0), pool_id=POOL, timeout=30, tenant="key-1")
        await wait_until(lambda: not dispatcher.queue.charges, timeout=10, what="corrections sent")
    assert float(await aredis.hget(keys.tenant_served(POOL), "key-1")) == 3.0
    assert float(await aredis.hget(keys.tenant_counters(POOL), "*last")) == 3.0  # left at its 3rd launch


@contextlib.asynccontextmanager
async def backend_without_usage() -> AsyncIterator[str]:
    """A small real OpenAI-compatible server whose completions report no ``usage``."""

    async def complete(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response(
            {
                "id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
                ],
            }
        )  # fmt: skip

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


async def test_a_backend_without_usage_leaves_the_estimate_as_the_charge(aredis, keys) -> None:
    async with backend_without_usage() as url:
        config = one_fair_pool(url, "tokens", slots=1)
        async with (
            Producer(aredis, keys=keys) as producer,
            running_dispatcher(aredis, keys, config, concurrency=1) as dispatcher,
        ):
            done = await producer.submit(
                call("y" * 80, max_tokens=50), pool_id=POOL, timeout=30, tenant="key-3"
            )
            assert "usage" not in done.completion
            await wait_until(lambda: not dispatcher.queue.charges, timeout=10, what="the charge settled")
    estimate = TenantCost().of(*estimate_tokens(call("y" * 80)["messages"], {"max_tokens": 50}, 256))
    assert float(await aredis.hget(keys.tenant_served(POOL), "key-3")) == pytest.approx(estimate)
    assert float(await aredis.hget(keys.tenant_counters(POOL), "*last")) == pytest.approx(estimate)


async def test_a_tenant_back_from_idle_banks_no_credit(aredis, keys, sim) -> None:
    config = one_fair_pool(sim.url, "tokens", slots=1)
    async with (
        Producer(aredis, keys=keys) as producer,
        running_dispatcher(aredis, keys, config, concurrency=1) as dispatcher,
    ):
        await producer.submit(call("a", latency_ms=0), pool_id=POOL, timeout=30, tenant="key-a")
        await wait_until(lambda: not dispatcher.queue.charges, timeout=10, what="a's charge settled")
        away = float(await aredis.hget(keys.tenant_counters(POOL), "key-a"))
        # While a is away, b keeps a backlog and its counter climbs far past a's.
        busy = [
            asyncio.create_task(
                producer.submit(call("b", latency_ms=60), pool_id=POOL, timeout=60, tenant="key-b")
            )
            for _ in range(16)
        ]
        await wait_until(lambda: sum(t.done() for t in busy) >= 4, timeout=20, what="b's first calls")
        b_now = float(await aredis.zscore(keys.tenants(POOL), "key-b"))
        assert b_now > away
        back = await producer.submit(call("a", latency_ms=0), pool_id=POOL, timeout=60, tenant="key-a")
        member = lease_member(POOL, back.request_id)
        await wait_until(lambda: member not in dispatcher.queue.charges, timeout=10, what="a's correction")
        # Read while b still waits: once nobody does, the reap may forget a's counter (idle at the floor).
        assert await aredis.zscore(keys.tenants(POOL), "key-b")
        after = float(await aredis.hget(keys.tenant_counters(POOL), "key-a"))
        await asyncio.wait_for(asyncio.gather(*busy), 60)
    usage = back.completion["usage"]
    entered = after - (usage["prompt_tokens"] + 4 * usage["completion_tokens"])  # less its own call
    # a re-entered at the floor, b's counter (b's in-flight estimates corrected since may have lowered
    # it a little), far above its own from before: time away banked no credit.
    assert entered > away + (b_now - away) / 2, (away, b_now, entered)


@pytest.mark.slow
async def test_two_dispatcher_processes_share_a_fair_pool_without_double_runs(
    aredis, keys, valkey_url
) -> None:
    async with SimulatorServer(SimulatorConfig()) as sim:
        config = replace(one_fair_pool(sim.url, "tokens", slots=4), group_id="tenants-fleet")
        await groups.publish(aredis, keys, config)
        procs = [
            start_dispatcher(valkey_url, keys.prefix, "tenants-fleet", f"d{i}", concurrency=2)
            for i in range(2)
        ]
        try:
            async with Producer(aredis, keys=keys) as producer:
                tasks = [
                    asyncio.create_task(
                        producer.submit(
                            {**call(f"t{i % 5} {i}", latency_ms=10), "user": f"u{i}"},
                            pool_id=POOL, timeout=60, tenant=f"key-{i % 5}",
                        )
                    )
                    for i in range(150)
                ]  # fmt: skip
                results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            codes = [proc.wait(20) for proc in procs]
    assert codes == [0, 0] and len(results) == 150
    assert set(sim.calls_by_user.values()) == {1} and len(sim.calls_by_user) == 150  # each ran once
    assert sim.peak_active <= 4
    assert int(await aredis.get(keys.pool_queued(POOL))) == 0
    assert await aredis.zcard(keys.tenants(POOL)) == 0
    # Every charge was corrected to the usage reported: what each tenant was served adds up to the work
    # done, whichever dispatcher charged and corrected it.
    # (The served hash, not the counters: the reap forgets idle tenants' counters at the floor.)
    counters = await aredis.hgetall(keys.tenant_served(POOL))
    served = sum(
        1.0 * r.completion["usage"]["prompt_tokens"] + 4.0 * r.completion["usage"]["completion_tokens"]
        for r in results
    )
    assert sum(float(v) for k, v in counters.items() if k != b"*last") == pytest.approx(served)


@pytest.mark.slow
async def test_pool_shares_are_unchanged_by_the_tenants_inside_a_pool(aredis, keys, sim) -> None:
    config = GroupConfig(
        group_id="tenants-shares",
        policy="drr",
        total_concurrency=4,
        default_endpoint_url=sim.url,
        version=1,
        pools=(
            PoolConfig("fair", quantum=1, max_concurrent=4, tenant_fairness="tokens"),
            PoolConfig("plain", quantum=3, max_concurrent=4),
        ),
    )
    await groups.publish(aredis, keys, config)
    async with Producer(aredis, keys=keys) as producer:
        tasks = [
            asyncio.create_task(
                producer.submit(
                    call(f"{i}", latency_ms=5), pool_id="fair", timeout=120, tenant=f"key-{i % 20}"
                )
            )
            for i in range(300)
        ] + [
            asyncio.create_task(producer.submit(call(f"{i}", latency_ms=5), pool_id="plain", timeout=120))
            for i in range(300)
        ]
        await wait_until(lambda: aredis.llen(keys.requests("plain")), timeout=20, what="plain's backlog")
        async with running_dispatcher(aredis, keys, config, concurrency=4) as dispatcher:
            launched = dispatcher.stats.launched_by_pool
            await wait_until(lambda: launched["fair"] + launched["plain"] >= 200, timeout=30)
            ratio = launched["plain"] / max(1, launched["fair"])
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert 2.4 <= ratio <= 3.8, f"plain:fair was {ratio:.2f}, expected about 3 as with no tenants"


async def test_the_spans_and_the_lease_record_carry_the_tenant(aredis, keys, sim, spans) -> None:
    provider, exporter = spans
    config = one_fair_pool(sim.url, "tokens", slots=1)
    async with (
        Producer(aredis, keys=keys, tracer=provider.get_tracer("p")) as producer,
        running_dispatcher(aredis, keys, config, concurrency=1, tracer=provider.get_tracer("t")),
    ):
        await producer.submit(call("hi", latency_ms=0), pool_id=POOL, timeout=30, tenant="key-5:bob")
        await producer.submit(call("hi", latency_ms=0), pool_id=POOL, timeout=30)
    dispatched = [
        s for s in exporter.get_finished_spans() if s.attributes[semconv.SPAN_KIND_ROLE] == "dispatcher"
    ]
    assert [s.attributes.get(semconv.TENANT) for s in dispatched] == ["key-5:bob", None]
    submitted = [
        s for s in exporter.get_finished_spans() if s.attributes[semconv.SPAN_KIND_ROLE] == "producer"
    ]
    assert [s.attributes.get(semconv.TENANT) for s in submitted] == ["key-5:bob", None]
    envelope = Envelope.decode(
        Envelope("r1", "p1", POOL, ChatCall.from_openai(call("hi")), time.time(), tenant="key-5:bob").encode()
    )
    raw = LeaseRecord.encode_of(envelope, pool_id=POOL, claimed_at=time.time(), dispatcher_id="d", cost=1)
    record = LeaseRecord.decode(raw)
    assert record is not None and record.tenant == "key-5:bob" and record.subject().tenant == "key-5:bob"
    assert LeaseRecord.decode(record.encode()) == record
    untagged = LeaseRecord.encode_of(
        replace(envelope, tenant=None), pool_id=POOL, claimed_at=0, dispatcher_id="d", cost=1
    )
    assert b"tenant" not in untagged  # an untagged call's record is the seed's


async def test_a_pool_switched_off_with_tenants_queued_drains_them(aredis, keys, sim) -> None:
    fair = one_fair_pool(sim.url, "tokens", slots=1)
    async with (
        Producer(aredis, keys=keys) as producer,
        running_dispatcher(aredis, keys, fair, concurrency=1) as dispatcher,
    ):
        slow = [
            asyncio.create_task(
                producer.submit(call(f"{i}", latency_ms=100), pool_id=POOL, timeout=60, tenant=f"key-{i % 3}")
            )
            for i in range(9)
        ]
        await wait_until(lambda: dispatcher.stats.launched_by_pool[POOL] >= 1, timeout=10, what="a launch")
        off = replace(fair, version=2, pools=(replace(fair.pools[0], tenant_fairness="off"),))
        await groups.publish(aredis, keys, off)
        await wait_until(lambda: dispatcher.config is not None and dispatcher.config.version == 2, timeout=10)
        late = await producer.submit(call("late", latency_ms=0), pool_id=POOL, timeout=60, tenant="key-9")
        await asyncio.wait_for(asyncio.gather(*slow), 30)  # none left behind in a tenant's list
    assert late.completion["choices"]
    assert int(await aredis.get(keys.pool_queued(POOL))) == 0
    assert not await aredis.keys(f"{keys.prefix}list:llm:tenant-requests:*")
