"""ScriptBatcher against a real Valkey: concurrent calls share pipelines, each gets its own result."""

from __future__ import annotations

import asyncio

from redis.exceptions import ResponseError

from runtime.producer import Producer
from runtime.valkey.batch import ScriptBatcher
from runtime.valkey.lua import LuaScript
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatching import CALL, one_pool_group, running_dispatcher, wait_until

INCR = LuaScript("return redis.call('INCRBY', KEYS[1], ARGV[1])")


async def test_concurrent_calls_share_a_pipeline_and_get_their_own_results(aredis, keys) -> None:
    batcher = ScriptBatcher(aredis, INCR)
    key = keys.prefix + "n"
    results = await asyncio.gather(*(batcher.run([key], [1]) for _ in range(50)))
    assert sorted(results) == list(range(1, 51))
    assert batcher.calls == 50 and batcher.batches < 50
    assert await batcher.run([key], [10]) == 60  # a lone call goes out on its own, at once
    await aredis.delete(key)


async def test_a_failed_batch_fails_each_of_its_callers(aredis, keys) -> None:
    batcher = ScriptBatcher(aredis, INCR)
    calls = [batcher.run([keys.prefix + "n"], ["not a number"]) for _ in range(3)]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(o, ResponseError) for o in outcomes)


async def test_dispatcher_finishes_share_round_trips_and_every_reply_arrives(aredis, keys) -> None:
    async with (
        SimulatorServer(SimulatorConfig()) as sim,
        running_dispatcher(aredis, keys, one_pool_group(sim.url)) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        results = await asyncio.gather(
            *(producer.submit(CALL, pool_id="default", timeout=30) for _ in range(200))
        )
        finishes = dispatcher.queue.finishes
    assert len(results) == 200 and all(r.completion["choices"] for r in results)
    assert finishes.calls == 200
    assert finishes.batches < 200


async def test_a_cancelled_caller_does_not_stop_its_call(aredis, keys) -> None:
    batcher = ScriptBatcher(aredis, INCR)
    key = keys.prefix + "c"
    waiting = asyncio.create_task(batcher.run([key], [5]))
    await wait_until(lambda: batcher.calls == 1)  # queued and on its way
    waiting.cancel()
    assert await batcher.run([key], [1]) == 6
    await aredis.delete(key)
