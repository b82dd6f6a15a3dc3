"""A scheduling round that leaves nothing queued is not followed by an empty one (issue 13).

The round that empties a list learns so from its own CLAIM (the backlog left right after the pop,
in the same script); a request pushed later makes the list non-empty, so its producer's wake token
brings the next round. The idle poll is set to a minute here, so a request left without a wake-up
would visibly stall the tests instead of being picked up by the poll.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from runtime.producer import Producer
from runtime.queue import groups
from runtime.wire.backendconfig import BackendConfig
from runtime.wire.groupconfig import PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatching import (
    CALL,
    NO_POLL,
    one_pool_group,
    one_pool_stack,
    running_dispatcher,
    slow_call,
    submit_one_at_a_time,
    wait_until,
)


async def test_one_round_per_call_when_the_queue_empties(aredis, keys) -> None:
    # Without claim tickets (at concurrency 1 they take the rounds' place: test_round_trip.py).
    async with one_pool_stack(aredis, keys, claim_tickets=False, **NO_POLL) as (dispatcher, producer):
        await producer.submit(CALL, pool_id="default", timeout=10)
        rounds = dispatcher.stats.rounds
        await submit_one_at_a_time(producer, 20)
        assert dispatcher.stats.rounds - rounds == 20


async def test_calls_pushed_while_a_round_runs_are_not_stranded(aredis, keys) -> None:
    """Eight callers back to back race their pushes against the rounds that claim and empty the list."""
    calls, callers = 400, 8
    async with one_pool_stack(aredis, keys, **NO_POLL) as (_, producer):
        left = calls

        async def caller() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await producer.submit(CALL, pool_id="default", timeout=20)

        async with asyncio.timeout(40):  # a stranded call would wait for the minute-long poll
            await asyncio.gather(*(caller() for _ in range(callers)))


async def test_a_burst_into_free_slots_starts_in_a_handful_of_rounds(aredis, keys) -> None:
    """400 requests waiting when the dispatcher starts, 400 free slots: each round that launched every
    head it read, with backlog left, reads twice as deep the next time (8, 16, ... 128), so they all
    start in 7 rounds, not in 400 / peek_depth = 50 round trips (issue 23, long calls)."""
    burst = 400
    async with (
        SimulatorServer(SimulatorConfig()) as sim,
        Producer(aredis, keys=keys) as producer,
    ):
        config = one_pool_group(sim.url, total=burst, max_concurrent=burst)

        async def queued() -> bool:
            return await aredis.llen(keys.requests("default")) == burst

        calls = [
            asyncio.create_task(producer.submit(slow_call(3000), pool_id="default", timeout=60))
            for _ in range(burst)
        ]
        await wait_until(queued, timeout=20, what="the burst queued")
        async with running_dispatcher(aredis, keys, config, concurrency=burst, **NO_POLL) as dispatcher:
            await wait_until(lambda: len(dispatcher.running) == burst, timeout=20)
            assert dispatcher.stats.rounds <= 10
            assert all(not c.done() for c in calls)  # all started together: none finished yet
            results = await asyncio.gather(*calls)
    assert len({r.request_id for r in results}) == burst


@pytest.mark.parametrize("claim_tickets", [False, True])
async def test_a_pool_a_new_configuration_adds_is_woken_by_its_own_tokens(
    aredis, keys, claim_tickets
) -> None:
    """The wake lists are built once per configuration: one that adds a pool has the waiter block on
    the new pool's list too, and its tokens' requests are claimed at once (one round trip each), not
    left for the minute-long poll; with claim tickets, a ticket stands in the new pool too, and its
    pushes claim their requests for the dispatcher's inbox (no round at all)."""
    async with (
        SimulatorServer(SimulatorConfig()) as sim,
        running_dispatcher(
            aredis, keys, one_pool_group(sim.url), claim_tickets=claim_tickets, **NO_POLL
        ) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        await producer.submit(CALL, pool_id="default", timeout=10)
        first = one_pool_group(sim.url)
        added = dataclasses.replace(first, pools=(*first.pools, PoolConfig(pool_id="added")), version=2)
        await groups.publish(aredis, keys, added)
        await wait_until(lambda: dispatcher.config is not None and dispatcher.config.version == 2)
        assert keys.wake_list("added") in dispatcher._wake_lists()
        assert keys.inbox(dispatcher.identity.dispatcher_id, "added") in dispatcher._wake_lists()
        await producer.submit(CALL, pool_id="added", timeout=10)  # the first round after the change
        rounds, trips, claims = (
            dispatcher.stats.rounds,
            dispatcher.queue.trips,
            dispatcher.stats.ticket_claims,
        )
        async with asyncio.timeout(20):  # a request whose token nobody waits for stalls for the poll
            for _ in range(10):
                await producer.submit(CALL, pool_id="added", timeout=10)
        if claim_tickets:
            assert dispatcher.stats.ticket_claims - claims == 10, dispatcher.stats
            assert dispatcher.stats.rounds - rounds == 0
            assert dispatcher.queue.trips - trips == 0
        else:
            assert dispatcher.stats.rounds - rounds == 10
            assert dispatcher.queue.trips - trips == 10  # each claimed from its wake token, no read first


async def test_a_backend_row_costs_its_rounds_no_round_trip_of_their_own(aredis, keys) -> None:
    """A pool routed through a backend row (load gate, shared breaker) was read in a pipeline of its own
    before every round: one round trip more per call at concurrency 1. Its reading now rides in the
    pipelines the rounds send anyway, and decides the next round while young (issue 23). (Rounds, so
    without claim tickets: with them no round runs, see the test below.)"""
    async with SimulatorServer(SimulatorConfig(kind="openai")) as sim:
        backend = BackendConfig("sim", sim.url, kind="openai", load_gating=False, max_in_flight=16)
        plain = one_pool_group(sim.url)
        config = dataclasses.replace(plain, default_endpoint_url="", backend_id="sim", backends=(backend,))
        async with (
            running_dispatcher(aredis, keys, config, claim_tickets=False, **NO_POLL) as dispatcher,
            Producer(aredis, keys=keys) as producer,
        ):
            await producer.submit(CALL, pool_id="default", timeout=10)
            fleet = dispatcher.fleet
            # Every reading counts as young, whatever this machine's speed: the counts are exact.
            fleet.status_max_age_s = 60.0
            refreshes, trips, read_at = fleet.refreshes, dispatcher.queue.trips, fleet.read_at
            await submit_one_at_a_time(producer, 20)
            assert dispatcher.queue.trips - trips == 20  # one pipeline per call, as without a backend row
            assert fleet.refreshes == refreshes and fleet.read_at > read_at  # read by those pipelines
            fleet.status_max_age_s = 0.0  # as before: every round reads in a round trip of its own
            await submit_one_at_a_time(producer, 20)
            assert fleet.refreshes - refreshes == 20


async def test_a_backend_rows_pool_at_concurrency_1_runs_on_tickets_its_reading_riding_the_waiter(
    aredis, keys
) -> None:
    """Behind a backend row, too, a push claims for the idle dispatcher's ticket: no round, no round
    trip of the dispatcher's own per call; the backend's reading rides before the waiter's BLPOP when
    due (here: always), so the ticket's limit and the breaker stay as fresh as a round's."""
    async with SimulatorServer(SimulatorConfig(kind="openai")) as sim:
        backend = BackendConfig("sim", sim.url, kind="openai", load_gating=False, max_in_flight=16)
        plain = one_pool_group(sim.url)
        config = dataclasses.replace(plain, default_endpoint_url="", backend_id="sim", backends=(backend,))
        async with (
            running_dispatcher(aredis, keys, config, **NO_POLL) as dispatcher,
            Producer(aredis, keys=keys) as producer,
        ):
            await producer.submit(CALL, pool_id="default", timeout=10)
            fleet = dispatcher.fleet
            fleet.status_max_age_s = 0.0
            # The first ticket stands once a reading said the backend has room.
            await wait_until(lambda: aredis.llen(keys.tickets("default")), what="the ticket posted")
            refreshes, trips, rounds = fleet.refreshes, dispatcher.queue.trips, dispatcher.stats.rounds
            claims, read_at = dispatcher.stats.ticket_claims, fleet.read_at
            await submit_one_at_a_time(producer, 20)
            assert dispatcher.stats.ticket_claims - claims == 20, dispatcher.stats
            assert dispatcher.stats.rounds == rounds and dispatcher.queue.trips == trips
            assert fleet.refreshes == refreshes and fleet.read_at > read_at  # read by the waiter
        # Every call's backend lease went with its FINISH: none left to count against the limit.
        assert await aredis.zcard(keys.backend_inflight("sim")) == 0
