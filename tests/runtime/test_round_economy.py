"""A scheduling round that leaves nothing queued is not followed by an empty one (issue 13).

The round that empties a list learns so from its own CLAIM (the backlog left right after the pop,
in the same script); a request pushed later makes the list non-empty, so its producer's wake token
brings the next round. The idle poll is set to a minute here, so a request left without a wake-up
would visibly stall the tests instead of being picked up by the poll.
"""

from __future__ import annotations

import asyncio

from tests.support.dispatching import CALL, NO_POLL, one_pool_stack, submit_one_at_a_time


async def test_one_round_per_call_when_the_queue_empties(aredis, keys) -> None:
    async with one_pool_stack(aredis, keys, **NO_POLL) as (dispatcher, producer):
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
