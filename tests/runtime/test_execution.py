"""Executor: a call's end (reply, lease, span) against a real Valkey and the real simulator."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from runtime.producer import Producer
from tests.runtime.harness import CALL, one_pool_group, running_dispatcher


async def test_a_reply_whose_finish_valkey_failed_is_retried_and_arrives(aredis, keys, sim) -> None:
    async with running_dispatcher(
        aredis, keys, one_pool_group(sim.url), reconnect_backoff_s=(0.01, 0.05)
    ) as dispatcher:
        executor = dispatcher.executor
        finish = executor.queue.finish
        attempts: list[dict[str, Any]] = []

        async def fails_twice_then_finishes(**kwargs: Any) -> int:
            attempts.append(kwargs)
            if len(attempts) <= 2:
                raise RedisConnectionError("Valkey went away (injected)")
            return await finish(**kwargs)

        executor.queue.finish = fails_twice_then_finishes  # type: ignore[method-assign]
        async with Producer(aredis, keys=keys) as producer:
            result = await producer.submit(CALL, pool_id="default", timeout=10)
    assert result.completion["choices"]
    assert len(attempts) == 3 and attempts[0] == attempts[2]  # the same reply, sent again
    assert dispatcher.stats.valkey_outages >= 1  # other loops may have reached Valkey in between
    assert dispatcher.stats.completed == 1
