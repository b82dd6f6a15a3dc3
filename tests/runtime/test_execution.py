"""Executor: a call's end (reply, lease, span) against a real Valkey and the real simulator."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from runtime.errors import InvalidHeader
from runtime.producer import Producer
from tests.support.dispatching import CALL, one_pool_group, running_dispatcher
from tests.support.durable import RETRYING, group, keyed


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


async def test_a_429_is_retried_no_sooner_than_its_retry_after(aredis, keys, sim) -> None:
    """The pool's own pause is at most 0.2 s here: only the backend's Retry-After can make it 1 s."""
    async with (
        running_dispatcher(aredis, keys, group(sim.url, **RETRYING)) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        started = time.monotonic()
        result = await producer.submit(
            keyed("r", status=429, retry_after=1, fail_times=1), pool_id="default", timeout=20
        )
        took = time.monotonic() - started
    assert result.completion["choices"]
    assert sim.calls_by_key == {"r": 2}
    assert dispatcher.stats.retried == 1
    assert took >= 1.0


async def test_a_key_with_a_line_break_is_refused_typed_and_counted_and_never_sent(aredis, keys, sim) -> None:
    """An operator pasted the key with a line break: the call ends with ``invalid_header`` (not an
    internal error), is counted by that type, and no request reached the backend."""
    config = replace(one_pool_group(sim.url), api_key_env="KEY")
    async with (
        running_dispatcher(aredis, keys, config, secrets={"KEY": "sk-1\r\nx-injected: yes"}) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        with pytest.raises(InvalidHeader) as refused:
            await producer.submit(keyed("k"), pool_id="default", timeout=10)
    assert "authorization" in str(refused.value) and "sk-1" not in str(refused.value)
    assert dispatcher.stats.failed == {"invalid_header": 1}
    assert dispatcher.stats.internal_errors == 0
    assert sim.calls_by_key == {}
