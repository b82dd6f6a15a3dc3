"""kill -9 of the embedded Valkey with work queued and in flight, real dispatcher processes, a restart.

Durable: every request the producer had acknowledged is answered exactly once (the AOF brings back the
queue, the leases and the producer's liveness; a lease that expired meanwhile runs its request again,
and the producer keeps the first reply). Lists: a call that finished while Valkey was down is answered
once it is back (its FINISH keeps trying); one whose FINISH gave up first is counted, never silent
(tests/runtime/test_dispatcher.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest
import redis

from runtime.producer import Producer
from runtime.queue import groups
from runtime.valkey import embedded
from runtime.valkey.client import connect
from runtime.wire.groupconfig import DURABLE, LISTS, GroupConfig, PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatcher_process import start_dispatcher, stop_dispatcher
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow
LEASE_S = 3.0


@pytest.fixture
async def backend() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(SimulatorConfig()) as server:
        yield server


def keyed(key: str, latency_ms: int) -> dict[str, object]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": key}],
            "sim": {"key": key, "latency_ms": latency_ms}}  # fmt: skip


def group(endpoint: str, delivery: str) -> GroupConfig:
    return GroupConfig(
        group_id="g",
        policy="fifo",
        total_concurrency=4,
        default_endpoint_url=endpoint,
        delivery=delivery,
        pools=(PoolConfig(pool_id="default", max_concurrent=4),),
        version=1,
    )


def kill_valkey(server: embedded.EmbeddedValkey) -> None:
    os.kill(server.pid, signal.SIGKILL)
    os.waitpid(server.pid, 0)  # started by this test process: reaped, so its pid is gone


@pytest.mark.timeout(180)
async def test_durable_work_survives_a_valkey_kill_and_each_request_is_answered_once(
    private_valkey, keys, backend
) -> None:
    client = connect(private_valkey.url)
    await groups.publish(client, keys, group(backend.url, DURABLE))
    dispatchers = [
        start_dispatcher(private_valkey.url, keys.prefix, "g", f"d{i}", concurrency=4, lease_s=LEASE_S)
        for i in range(2)
    ]
    try:
        async with Producer(client, keys=keys) as producer:
            calls = [
                asyncio.create_task(producer.submit(keyed(f"r{i}", 1000), pool_id="default", timeout=90))
                for i in range(12)
            ]
            # Acknowledged: every push has returned (4 run, 8 wait in the queue).
            with redis.Redis.from_url(private_valkey.url) as check:
                await wait_until(
                    lambda: len(backend.calls_by_key) == 4 and check.llen(keys.requests("default")) == 8,
                    timeout=20,
                    what="4 in flight and 8 queued",
                )
            kill_valkey(private_valkey)
            # The scenario: Valkey stays down until the running calls (1 s) have finished: their replies
            # wait for it (or their leases, restored from the AOF, expire and run them again).
            await asyncio.sleep(2.0)
            restarted = embedded.start(private_valkey.data_dir)
            assert restarted.port == private_valkey.port  # everyone reconnects to the URL they have
            results = await asyncio.gather(*calls)
            assert sorted(r.request_id for r in results) == sorted({r.request_id for r in results})
            assert all(r.completion["choices"] for r in results)
            assert producer.stats.completed == 12 and producer.stats.failed == 0
        assert sorted(backend.calls_by_key) == sorted(f"r{i}" for i in range(12))
    finally:
        for proc in dispatchers:
            stop_dispatcher(proc)
        await client.aclose()


@pytest.mark.timeout(180)
async def test_lists_calls_that_finish_while_valkey_is_down_are_answered_when_it_is_back(
    private_valkey, keys, backend
) -> None:
    """Before issue 21's fix FINISH gave up after ~1.5 s: these 4 calls were lost (reply_undelivered)."""
    client = connect(private_valkey.url)
    await groups.publish(client, keys, group(backend.url, LISTS))
    dispatcher = start_dispatcher(private_valkey.url, keys.prefix, "g", "d", concurrency=4, lease_s=LEASE_S)
    try:
        async with Producer(client, keys=keys) as producer:
            calls = [
                asyncio.create_task(producer.submit(keyed(f"l{i}", 800), pool_id="default", timeout=8))
                for i in range(4)
            ]
            await wait_until(lambda: len(backend.calls_by_key) == 4, timeout=20, what="4 in flight")
            kill_valkey(private_valkey)
            # The scenario: Valkey stays down until every running call has finished and found no Valkey
            # to reply through (the calls take 0.8 s).
            await asyncio.sleep(2.5)
            embedded.start(private_valkey.data_dir)
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
        with redis.Redis.from_url(private_valkey.url) as check:
            await wait_until(
                lambda: int(check.hget(keys.counters("g"), "completed") or 0) >= 4,
                timeout=15,
                what="4 completions counted",
            )
            assert int(check.hget(keys.counters("g"), "dropped:reply_undelivered") or 0) == 0
    finally:
        stop_dispatcher(dispatcher)
        await client.aclose()
