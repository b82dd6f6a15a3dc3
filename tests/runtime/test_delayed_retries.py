"""Retries waiting in ``zset:llm:delayed:{pool_id}`` are never stranded nor run for nobody: lowering
``max_attempts`` meanwhile still runs them; withdrawing the request takes them out. A real dispatcher,
the real simulator over HTTP, real Valkey."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest

from runtime.producer import Producer
from runtime.queue import groups
from runtime.wire.contract import ChatCall, Envelope, envelope_prefix
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatching import running_dispatcher, wait_until
from tests.support.durable import group, keyed

# Retry-After 2 s is the least pause before the second attempt: the retry surely waits in the set.
FAIL_ONCE = {"status": 503, "fail_times": 1, "retry_after": 2}
RETRYING = {"max_attempts": 3, "retry_backoff_base_s": 0.05, "retry_backoff_cap_s": 0.1}


@pytest.fixture
async def backend() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(SimulatorConfig()) as server:
        yield server


@pytest.mark.parametrize(("attempt", "requeues"), [(1, 0), (2, 0), (3, 1), (7, 4)])
@pytest.mark.parametrize("request_id", ["r-1", 'odd "id", with\\escapes', "ünïcode"])
def test_every_attempt_of_a_request_starts_with_its_prefix(
    request_id: str, attempt: int, requeues: int
) -> None:
    call = ChatCall.from_openai({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    raw = Envelope(
        request_id, "p-1", "pool", call, enqueued_at=1.7e9, attempt=attempt, requeues=requeues
    ).encode()
    assert raw.startswith(envelope_prefix(request_id, "p-1"))
    assert not raw.startswith(envelope_prefix(request_id + "x", "p-1"))
    assert not raw.startswith(envelope_prefix(request_id, "p-2"))


async def test_a_retry_still_runs_after_max_attempts_was_lowered_to_one(aredis, keys, backend) -> None:
    config = group(backend.url, **RETRYING)
    async with (
        running_dispatcher(aredis, keys, config) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        call = asyncio.create_task(producer.submit(keyed("low", **FAIL_ONCE), pool_id="default", timeout=30))
        await wait_until(lambda: dispatcher.stats.retried == 1, timeout=10, what="a delayed retry")
        assert await aredis.zcard(keys.delayed("default")) == 1
        lowered = dataclasses.replace(config.pools[0], max_attempts=1)
        await groups.publish(aredis, keys, dataclasses.replace(config, pools=(lowered,), version=2))
        await wait_until(lambda: dispatcher.config is not None and dispatcher.config.version == 2, timeout=10)
        result = await call
    assert result.completion["choices"] and backend.calls_by_key == {"low": 2}
    assert await aredis.zcard(keys.delayed("default")) == 0


async def test_a_withdrawn_request_whose_retry_waits_is_taken_out_and_counted(aredis, keys, backend) -> None:
    async with (
        running_dispatcher(aredis, keys, group(backend.url, **RETRYING)) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        call = asyncio.create_task(producer.submit(keyed("gone", **FAIL_ONCE), pool_id="default", timeout=30))
        await wait_until(lambda: dispatcher.stats.retried == 1, timeout=10, what="a delayed retry")
        call.cancel()  # the caller went away (as an ingress client that disconnects)
        with pytest.raises(asyncio.CancelledError):
            await call
        # Nothing is left that could run it: not in the delayed set, not in the list, not running.
        assert await aredis.zcard(keys.delayed("default")) == 0
        assert await aredis.llen(keys.requests("default")) == 0 and not dispatcher.running
        assert int(await aredis.hget(keys.counters("g"), "dropped:cancelled") or 0) == 1
    assert backend.calls_by_key == {"gone": 1}
