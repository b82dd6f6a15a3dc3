"""One round trip per decision in a group with a fair pool (issues 22 and 23): ROUND reads a fair pool
by tenant, as TENANT_OBSERVE does, takes the group's turn only when the view holds a tenant to launch
from and gives it back in the script otherwise, so a fair group needs no observe pipeline of its own
(TURN_ACQUIRE) nor a release behind its claims (TURN_RELEASE)."""

from __future__ import annotations

import asyncio

from runtime.policy.admission import AdmissionLimits
from runtime.policy.reads import PoolRead
from runtime.producer import Producer
from runtime.queue import groups
from runtime.queue.deciding import TURN_ELSEWHERE, TURN_NONE, TURN_OURS, NextRound
from runtime.queue.dispatching import QueueOps
from runtime.queue.producing import ProducerOps
from runtime.queue.tenants import TenantPush
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer
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
