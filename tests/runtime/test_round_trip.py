"""One round trip per decision (issue 23): ROUND reads the next decision's observation behind the
claims, takes the turn only for an observation that allows a launch, and reads nothing for a
dispatcher that finds the turn taken; a push's wake token carries its request, so a lone dispatcher
claims it in its first round trip; a dispatcher with no free slot runs no round."""

from __future__ import annotations

import asyncio
import time

from runtime.policy.reads import PoolRead
from runtime.producer import Producer
from runtime.queue import registry
from runtime.queue.deciding import TURN_ELSEWHERE, TURN_NONE, TURN_OURS, NextRound
from runtime.queue.dispatching import REAP_INTERVAL_S, QueueOps
from runtime.queue.keys import WAKE_HEAD_MAX_BYTES, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS
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


def next_round(holder: str, *, free: int = 4, depth: int = 4, pool_max: int = 8) -> NextRound:
    return NextRound(
        holder=holder,
        reads=(PoolRead("a", depth=depth, pool_max=pool_max), PoolRead("b", depth=depth, pool_max=pool_max)),
        local_slots=8,
        free=free,
        group_limit=8,
        wake_pool="a",
    )


async def test_round_takes_the_turn_only_for_an_observation_that_allows_a_launch(aredis, keys) -> None:
    queue = QueueOps(aredis, keys, "g")
    empty = await queue.round(next_round("d1"))
    assert queue.turn == TURN_NONE and not await aredis.exists(keys.schedule_turn("g"))
    assert empty.views["a"].backlog == 0 and empty.group_in_flight == 0
    await aredis.rpush(keys.requests("a"), b"r1", b"r2")
    seen = await queue.round(next_round("d1"))
    assert queue.turn == TURN_OURS and await aredis.get(keys.schedule_turn("g")) == b"d1"
    assert seen.views["a"].heads == (b"r1", b"r2") and seen.views["a"].heads_read
    assert seen.views["b"].backlog == 0
    # No free slot after the claims: nothing is read for launching, and the turn goes back.
    full = await queue.round(next_round("d1", free=0))
    assert queue.turn == TURN_NONE and not await aredis.exists(keys.schedule_turn("g"))
    assert full.views["a"].backlog == 2 and full.views["a"].heads == ()
    # ... and, with backlog left for others' slots, one idle dispatcher is woken for it.
    assert await aredis.lrange(keys.wake_list("a"), 0, -1) == [b"1"]


async def test_a_dispatcher_that_finds_the_turn_taken_reads_nothing_and_is_woken_later(aredis, keys) -> None:
    holder, other = QueueOps(aredis, keys, "g"), QueueOps(aredis, keys, "g")
    await aredis.rpush(keys.requests("a"), b"r1")
    await holder.round(next_round("d1"))
    assert holder.turn == TURN_OURS
    seen = await other.round(next_round("d2"))
    assert other.turn == TURN_ELSEWHERE and seen.views == {}
    assert other.fleet_slots == (8, 8)  # both are registered in the fleet all the same
    assert await aredis.exists(keys.schedule_again("g"))
    await aredis.delete(keys.requests("a"))  # the holder claimed it: its next ROUND allows nothing
    await holder.round(next_round("d1"))
    assert holder.turn == TURN_NONE and not await aredis.exists(keys.schedule_turn("g"))
    assert await aredis.lrange(keys.wake_list("a"), 0, -1) == [b"1"]  # the note became a wake token


async def test_a_slot_freed_while_another_holds_the_turn_leaves_a_note_not_a_token(aredis, keys) -> None:
    """A token then would only wake a dispatcher into a round that finds the turn taken."""
    holder, finisher = QueueOps(aredis, keys, "g"), QueueOps(aredis, keys, "g")
    await aredis.rpush(keys.requests("a"), b"r1")
    await holder.round(next_round("d1"))
    assert holder.turn == TURN_OURS

    async def finish() -> None:
        await finisher.finish(
            pool_id="a", producer_id="p", member="m", reply=b"", reply_ttl_s=1, group_pools=["a", "b"]
        )

    await finish()
    assert await aredis.llen(keys.wake_list("a")) == 0
    assert await aredis.exists(keys.schedule_again("g"))
    await aredis.delete(keys.requests("a"))  # the holder claimed it: its next ROUND allows nothing
    await aredis.rpush(keys.requests("b"), b"r2")  # ... and b is at its cap for the holder (depth 0)
    await holder.round(NextRound("d1", (PoolRead("a", 4, 8), PoolRead("b", 0, 8)), 8, 4, 8, "a"))
    assert holder.turn == TURN_NONE
    assert await aredis.lrange(keys.wake_list("a"), 0, -1) == [b"1"]  # the note became the token
    await aredis.delete(keys.wake_list("a"))
    await finish()  # nobody holds the turn now: the freed slot wakes one at once
    assert await aredis.lrange(keys.wake_list("a"), 0, -1) == [b"1"]


async def test_a_push_that_fills_an_empty_list_wakes_with_the_request_itself(aredis, keys) -> None:
    push = registry.script("push").bind(aredis)
    script_keys = [keys.requests("p"), keys.wake_list("p")]
    args = [WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS]
    await push(keys=script_keys, args=[b"small", *args])
    await push(keys=script_keys, args=[b"behind", *args])  # behind a backlog: no token of its own
    assert await aredis.lrange(keys.wake_list("p"), 0, -1) == [b"small"]
    await aredis.delete(*script_keys)
    await push(keys=script_keys, args=[b"x" * (WAKE_HEAD_MAX_BYTES + 1), *args])
    assert await aredis.lrange(keys.wake_list("p"), 0, -1) == [b"1"]  # too big to copy: a plain token


async def test_a_lone_dispatcher_takes_one_round_trip_per_call_at_concurrency_one(aredis, keys) -> None:
    """Without claim tickets (runtime.dispatch.tickets): each push's wake token brings one round."""
    async with one_pool_stack(aredis, keys, claim_tickets=False, **NO_POLL) as (dispatcher, producer):
        await producer.submit(CALL, pool_id="default", timeout=10)
        # (The first use of a script after a SCRIPT FLUSH may run ROUND before the claim it follows,
        # whose NOSCRIPT retry comes after: the warm-up call takes that, a claim lost at worst.)
        trips, rounds, lost = dispatcher.queue.trips, dispatcher.stats.rounds, dispatcher.stats.claim_lost
        await submit_one_at_a_time(producer, 20)
        assert dispatcher.stats.rounds - rounds == 20
        assert dispatcher.queue.trips - trips == 20  # the claim and ROUND in one pipeline, nothing else
        assert dispatcher.stats.claim_lost == lost, dispatcher.stats


async def test_with_claim_tickets_a_call_at_concurrency_one_takes_no_round_and_no_claim_trip(
    aredis, keys
) -> None:
    """Each push claims its request against the dispatcher's standing ticket: the call starts from the
    waiter's BLPOP, and the rounds' connection carries nothing but FINISH."""
    async with one_pool_stack(aredis, keys, **NO_POLL) as (dispatcher, producer):
        await producer.submit(CALL, pool_id="default", timeout=10)
        trips, rounds, claims = (
            dispatcher.queue.trips,
            dispatcher.stats.rounds,
            dispatcher.stats.ticket_claims,
        )
        await submit_one_at_a_time(producer, 20)
        assert dispatcher.stats.ticket_claims - claims == 20, dispatcher.stats
        assert dispatcher.stats.rounds - rounds == 0
        assert dispatcher.queue.trips - trips == 0
        assert dispatcher.stats.tickets_given_back == 0


async def test_a_wake_tokens_claim_sends_round_behind_it_only_when_the_reap_is_due(aredis, keys) -> None:
    """The claim reports the backlog its pop left (none here), so ROUND behind it would find the list
    empty: it rides along to reap (every REAP_INTERVAL_S), or while a call still runs (here: the last
    one's span after its reply, now and then). Before: one ROUND per call."""
    async with one_pool_stack(aredis, keys, claim_tickets=False, **NO_POLL) as (dispatcher, producer):
        await producer.submit(CALL, pool_id="default", timeout=10)
        sent, started = dispatcher.queue.rounds_sent, time.monotonic()
        await submit_one_at_a_time(producer, 20)
        elapsed = time.monotonic() - started
        rounds = dispatcher.queue.rounds_sent - sent
        assert rounds <= 1 + elapsed / REAP_INTERVAL_S, (rounds, elapsed, dispatcher.stats)
        # Pushed together, the second may land behind the first's token (no token of its own): the
        # claim's count then brings a round of the dispatcher's own, not the idle poll a minute away.
        await asyncio.gather(*(producer.submit(CALL, pool_id="default", timeout=5) for _ in range(4)))
        [pool] = dispatcher.snapshot()["pools"]  # as the claims left it: nothing queued
        assert pool["queue_depth"] == 0 and pool["oldest_pending_age_s"] is None, pool


async def test_rounds_after_a_claim_decide_from_the_observation_the_claim_brought_back(aredis, keys) -> None:
    """A backlog of 40 drained four heads a round: every round but the first is one claim pipeline."""
    async with SimulatorServer(SimulatorConfig()) as sim, Producer(aredis, keys=keys) as producer:
        calls = [asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=20)) for _ in range(40)]

        async def queued() -> bool:
            return await aredis.llen(keys.requests("default")) == 40

        await wait_until(queued, what="the backlog queued")
        config = one_pool_group(sim.url, total=64, max_concurrent=64)
        async with running_dispatcher(aredis, keys, config, peek_depth=4, **NO_POLL) as dispatcher:
            await asyncio.gather(*calls)
            rounds, trips = dispatcher.stats.rounds, dispatcher.queue.trips
    # Before: an observe and a claim pipeline per round (80 trips or more). Now the first round
    # observes, each claim pipeline brings back the next four heads, and the last finds nothing left
    # (a round or two more may run on the finishes' wake tokens, each one fresh ROUND).
    assert rounds <= 15, rounds
    assert trips - rounds <= 3, (trips, rounds)


async def test_a_dispatcher_without_a_free_slot_runs_no_round(aredis, keys) -> None:
    """Its one slot is busy for 600 ms while requests wait and the idle poll is due every 10 ms."""
    async with one_pool_stack(aredis, keys, concurrency=1, idle_poll_s=0.01) as (dispatcher, producer):
        first = asyncio.create_task(producer.submit(slow_call(600), pool_id="default", timeout=20))
        await wait_until(lambda: len(dispatcher.running) == 1, what="the slow call running")
        rounds = dispatcher.stats.rounds
        rest = [asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=20)) for _ in range(3)]
        await wait_until(lambda: aredis.llen(keys.requests("default")), what="requests queued behind it")
        busy_rounds = await wait_for_result(first, lambda: dispatcher.stats.rounds - rounds)
        await asyncio.gather(*rest)
    # The one round allowed: the freed slot's, which may run before the reply reaches its caller.
    assert busy_rounds <= 1, busy_rounds  # before: a round per idle poll (28 in a run on main)


async def wait_for_result(task: asyncio.Task, reading) -> int:  # type: ignore[no-untyped-def,type-arg]
    """``reading()`` as it was when ``task`` finished (read in the same loop turn as its result)."""
    done = asyncio.get_running_loop().create_future()
    task.add_done_callback(lambda _: done.set_result(reading()))
    await task
    return await done
