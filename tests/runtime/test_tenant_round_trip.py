"""One round trip per decision in a group with a fair pool (issues 22 and 23): ROUND reads a fair pool
by tenant, as TENANT_OBSERVE does, takes the group's turn only when the view holds a tenant to launch
from and gives it back in the script otherwise, so a fair group needs no observe pipeline of its own
(TURN_ACQUIRE) nor a release behind its claims (TURN_RELEASE)."""

from __future__ import annotations

import asyncio

from runtime.policy.admission import AdmissionLimits
from runtime.policy.reads import PoolRead
from runtime.producer import Producer
from runtime.queue import groups, scripts
from runtime.queue.deciding import TURN_ELSEWHERE, TURN_NONE, TURN_OURS, NextRound
from runtime.queue.dispatching import ClaimRequest, QueueOps, lease_member
from runtime.queue.producing import ProducerOps
from runtime.queue.tenant_dispatch import FairPick, token_request
from runtime.queue.tenants import TenantPush, tenant_push_plain_args
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from runtime.wire.reply import decode_reply_item
from simulator.server import SimulatorConfig, SimulatorServer
from tests.runtime.test_tenant_dispatch import one_fair_pool
from tests.runtime.test_tenant_redelivery import envelope
from tests.support.dispatching import CALL, NO_POLL, running_dispatcher, wait_until

POOL = "chat"
FAIR = frozenset({POOL})


def fair_round(holder: str, *, free: int = 4, depth: int = 4) -> NextRound:
    return NextRound(holder, (PoolRead(POOL, depth=depth, pool_max=8),), 8, free, 8, POOL, fair=FAIR)


async def test_round_reads_a_fair_pool_by_tenant_and_takes_the_turn_to_launch_from_it(aredis, keys) -> None:
    ops = ProducerOps(aredis, keys)
    for raw, tenant in ((b"a1", "acme"), (b"a2", "acme"), (b"b1", "bolt")):
        await ops.push(
            POOL, raw, AdmissionLimits(), tenant=TenantPush(tenant, 2.0 if tenant == "bolt" else 1.0)
        )
    await aredis.hset(keys.tenant_counters(POOL), "bolt", 0.0)
    queue = QueueOps(aredis, keys, "g")
    seen = await queue.round(fair_round("d1"))
    assert queue.turn == TURN_OURS and await aredis.get(keys.schedule_turn("g")) == b"d1"
    view = seen.fair[POOL]
    assert [(t.tenant, t.queued, t.heads, t.weight) for t in view.tenants] == [
        ("acme", 2, (b"a1", b"a2"), 1.0),
        ("bolt", 1, (b"b1",), 2.0),
    ]
    assert seen.views[POOL].backlog == 3 and seen.views[POOL].heads_read and seen.views[POOL].heads == ()
    assert queue.fair_backlog == {POOL: 3}
    # Another dispatcher finds the turn taken, and reads nothing.
    other = QueueOps(aredis, keys, "g")
    assert (await other.round(fair_round("d2"))).views == {} and other.turn == TURN_ELSEWHERE


async def test_round_gives_the_turn_back_when_the_fair_pools_view_holds_nobody_to_launch(
    aredis, keys
) -> None:
    """The case a fused ROUND must not get wrong: the pool's backlogged set exists, but each of its
    tenants' lists is empty (a stale member). Taking the turn for that observation would hold it while
    the decision launches nothing; the script lets the stale tenant leave and gives the turn back, and
    another dispatcher gets it at once instead of after the turn's lease."""
    await aredis.zadd(keys.tenants(POOL), {"ghost": 0.0})
    await aredis.set(keys.pool_queued(POOL), 0)
    queue = QueueOps(aredis, keys, "g")
    seen = await queue.round(fair_round("d1"))
    assert queue.turn == TURN_NONE and not await aredis.exists(keys.schedule_turn("g"))
    assert seen.fair[POOL].tenants == () and not await aredis.exists(keys.tenants(POOL))  # it left
    ops = ProducerOps(aredis, keys)
    await ops.push(POOL, b"r1", AdmissionLimits(), tenant=TenantPush("acme"))
    other = QueueOps(aredis, keys, "g")
    await other.round(fair_round("d2"))
    assert other.turn == TURN_OURS


async def test_round_with_no_free_slot_leaves_a_fair_pools_work_to_another_dispatcher(aredis, keys) -> None:
    ops = ProducerOps(aredis, keys)
    await ops.push(POOL, b"r1", AdmissionLimits(), tenant=TenantPush("acme"))
    await aredis.delete(keys.wake_list(POOL))  # the push's own token, taken by someone
    queue = QueueOps(aredis, keys, "g")
    seen = await queue.round(fair_round("d1", free=0))
    assert queue.turn == TURN_NONE and not await aredis.exists(keys.schedule_turn("g"))
    # Counted, and no tenant read: nothing could launch from them (as a plain pool's heads then).
    assert seen.views[POOL].backlog == 1 and seen.fair[POOL].tenants == ()
    assert await aredis.lrange(keys.wake_list(POOL), 0, -1) == [b"1"]  # one idle dispatcher woken


async def test_a_fair_pools_rounds_take_one_round_trip_each(aredis, keys) -> None:
    """A backlog of 40 over 5 tenants drained four heads a round: every round but the first is one claim
    pipeline (before: an observe pipeline with the turn, then the claims with its release, 2 a round)."""
    async with SimulatorServer(SimulatorConfig()) as sim, Producer(aredis, keys=keys) as producer:
        config = GroupConfig(
            group_id="fair", policy="drr", total_concurrency=64, default_endpoint_url=sim.url, version=1,
            pools=(PoolConfig(POOL, max_concurrent=64, tenant_fairness="tokens"),),
        )  # fmt: skip
        await groups.publish(aredis, keys, config)
        calls = [
            asyncio.create_task(producer.submit(CALL, pool_id=POOL, timeout=20, tenant=f"t{i % 5}"))
            for i in range(40)
        ]

        async def queued() -> bool:
            return int(await aredis.get(keys.pool_queued(POOL)) or 0) == 40

        await wait_until(queued, what="the backlog queued")
        async with running_dispatcher(aredis, keys, config, peek_depth=4, **NO_POLL) as dispatcher:
            await asyncio.gather(*calls)
            rounds, trips = dispatcher.stats.rounds, dispatcher.queue.trips
    assert rounds <= 15, rounds
    assert trips - rounds <= 3, (trips, rounds)
    assert sim.peak_active <= 64


def _launch(raw: bytes, request_id: str) -> ClaimRequest:
    return ClaimRequest(
        POOL, raw, "launch", lease_member=lease_member(POOL, request_id), producer_id="p1", pool_max=8,
        group_limit=8, lease_record=b"{}",
    )  # fmt: skip


async def test_a_wake_tokens_request_launches_only_while_its_tenant_is_the_pick(aredis, keys) -> None:
    """The pool's first queued request wakes a dispatcher with a token it can claim from (the request,
    its tenant's weight ahead); that claim, decided without a view, holds only while the tenant is the
    pick. Here a tenant with a lower id entered at the same counter meanwhile: it goes first."""
    await aredis.set(keys.producer_alive("p1"), b"1", ex=60)
    ops = ProducerOps(aredis, keys)
    zeta, alpha = envelope("z1", "zeta").encode(), envelope("a1", "alpha").encode()
    await ops.push(POOL, zeta, AdmissionLimits(), tenant=TenantPush("zeta", 2.0))
    [token] = await aredis.lrange(keys.wake_list(POOL), 0, -1)
    assert token_request(token) == (2.0, zeta)
    await ops.push(POOL, alpha, AdmissionLimits(), tenant=TenantPush("alpha"))
    assert await aredis.llen(keys.wake_list(POOL)) == 1  # the pool was not empty: no token
    queue = QueueOps(aredis, keys, "g")
    queue.fair_picks = {POOL: {zeta: FairPick("zeta", 5.0, 1, 8, 2.0, from_token=True)}}
    assert await queue.claim([_launch(zeta, "z1")], 30.0) == [("moved", 0, "")]
    assert await aredis.zrange(keys.tenants(POOL), 0, -1) == [b"alpha", b"zeta"]  # nothing charged
    queue.fair_picks = {POOL: {alpha: FairPick("alpha", 3.0, from_token=True)}}
    assert (await queue.claim([_launch(alpha, "a1")], 30.0))[0][0] == "claimed"
    queue.fair_picks = {POOL: {zeta: FairPick("zeta", 5.0, 1, 8, 2.0, from_token=True)}}
    assert (await queue.claim([_launch(zeta, "z1")], 30.0))[0][0] == "claimed"  # the pick now
    assert float(await aredis.hget(keys.tenant_counters(POOL), "zeta")) == 5.0
    # A token that is not a fair pool's request: a slot's, a plain pool's, a bad weight.
    assert [token_request(t) for t in (b"1", alpha, b"0 " + alpha, b"nan " + alpha, b"2.0 ")] == [None] * 5


async def test_a_lone_dispatcher_claims_a_fair_pools_call_from_its_wake_token(aredis, keys) -> None:
    """One call at a time to a fair pool: each is claimed from its wake token, one round trip a call
    (before: a ROUND to read the tenants, then the claim), charged as a view would have."""
    async with SimulatorServer(SimulatorConfig()) as sim, Producer(aredis, keys=keys) as producer:
        config = one_fair_pool(sim.url, "requests", slots=4)
        async with running_dispatcher(aredis, keys, config, **NO_POLL) as dispatcher:
            await producer.submit(CALL, pool_id=POOL, timeout=10, tenant="warm-up")
            rounds, trips = dispatcher.stats.rounds, dispatcher.queue.trips
            for i in range(20):  # t0 of weight 1, t1 of weight 2, in turns
                tenant, weight = f"t{i % 2}", 1.0 + i % 2
                await producer.submit(CALL, pool_id=POOL, timeout=10, tenant=tenant, tenant_weight=weight)
            assert dispatcher.stats.rounds - rounds == 20
            assert dispatcher.queue.trips - trips == 20
            await wait_until(lambda: not dispatcher.queue.charges, timeout=10, what="corrections sent")
    # Each call's tenant entered at the last leaver's counter and left at its launch, charged 1 / its
    # weight: 1 for the warm-up, then 1 + 0.5 for each of the ten turns.
    assert float(await aredis.hget(keys.tenant_counters(POOL), "*last")) == 16.0


async def test_a_wake_token_whose_tenant_is_not_the_pick_is_served_in_the_tenants_order(aredis, keys) -> None:
    """Two tenants' requests queued in one transaction while the dispatcher waits: it wakes with the
    first one's token, but the other tenant is the pick (the same counter, a lower id). The claim from
    the token refuses, a round reads the tenants, and the pick's call runs first."""
    await aredis.set(keys.producer_alive("p1"), b"1", ex=60)
    async with SimulatorServer(SimulatorConfig()) as sim:
        config = one_fair_pool(sim.url, "requests", slots=1)
        async with running_dispatcher(aredis, keys, config, concurrency=1, **NO_POLL) as dispatcher:
            await wait_until(lambda: dispatcher._idle.is_set(), timeout=10, what="the dispatcher waits")
            pushes = aredis.pipeline(transaction=True)
            for request_id, tenant in (("z1", "zeta"), ("a1", "alpha")):
                raw = envelope(request_id, tenant).encode()
                script_keys, args = tenant_push_plain_args(keys, POOL, raw, TenantPush(tenant))
                pushes.eval(scripts.TENANT_PUSH_PLAIN, len(script_keys), *script_keys, *args)
            await pushes.execute()
            replies = [await aredis.blpop([keys.replies("p1")], timeout=10) for _ in range(2)]
            assert dispatcher.stats.stale_tokens == 1
    assert [decode_reply_item(raw).request_id for _, raw in replies] == ["a1", "z1"]
