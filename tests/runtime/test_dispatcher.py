"""The queued path end to end: real Valkey over TCP, real HTTP to the simulator, a real dispatcher."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import orjson
import pytest

from runtime.config import ProducerSettings
from runtime.dispatch.stats import (
    DROP_EXPIRED,
    DROP_LOST_IN_FLIGHT,
    DROP_MALFORMED,
    DROP_PRODUCER_GONE,
    DROP_REPLY_PRODUCER_GONE,
    DROP_REPLY_UNDELIVERED,
)
from runtime.errors import (
    BackendConnectError,
    BackendHTTPError,
    BackendTimeout,
    EnvelopeTooLarge,
    RequestTimeout,
    UnknownPool,
)
from runtime.producer import Producer
from tests.support.dispatching import (
    CALL,
    fail_calls,
    one_pool_group,
    running_dispatcher,
    slow_call,
    wait_until,
)
from tests.support.producer_process import start_producer
from tests.support.waiting import wait_until_equal


async def test_round_trip(aredis, keys, sim) -> None:
    async with (
        running_dispatcher(aredis, keys, one_pool_group(sim.url)) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        result = await producer.submit(CALL, pool_id="default", timeout=10)
    assert result.completion["choices"][0]["message"]["role"] == "assistant"
    assert result.completion["usage"]["total_tokens"] > 0
    assert result.timing.total_s >= result.timing.execution_s > 0
    assert dispatcher.stats.completed == 1
    assert sim.completions_total == 1


@pytest.mark.slow
async def test_thousand_concurrent_submits_reach_their_own_callers(aredis, keys, sim) -> None:
    config = one_pool_group(sim.url, total=64, max_concurrent=64)
    async with running_dispatcher(aredis, keys, config), Producer(aredis, keys=keys) as producer:
        calls = [
            {"model": "sim-model", "messages": [{"role": "user", "content": f"question {i}"}]}
            for i in range(1000)
        ]
        results = await asyncio.gather(*(producer.submit(c, pool_id="default", timeout=60) for c in calls))
    # The simulator echoes the prompt, so each caller must see its own question in its answer.
    for i, result in enumerate(results):
        assert f"question {i}" in result.completion["choices"][0]["message"]["content"]
    assert len({r.request_id for r in results}) == 1000
    assert producer.waiting == 0 and producer.stats.late_replies == 0


async def test_producer_gone_before_execution_is_dropped_and_backend_never_called(
    aredis, keys, sim, valkey_url
) -> None:
    proc = start_producer(valkey_url, keys.prefix, 0)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "submitted"
        assert await aredis.llen(keys.requests("default")) == 1
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
        alive = keys.producer_alive("doomed")
        await wait_until_equal(
            lambda: aredis.exists(alive), 0, timeout=5, what="the killed producer's liveness key"
        )
    finally:
        proc.kill()
    async with running_dispatcher(aredis, keys, one_pool_group(sim.url)) as dispatcher:
        await wait_until(lambda: dispatcher.stats.dropped[DROP_PRODUCER_GONE] == 1)
    assert await aredis.llen(keys.requests("default")) == 0
    assert sim.completions_requested == 0
    assert await aredis.hget(keys.counters("g"), f"dropped:{DROP_PRODUCER_GONE}") == b"1"


@pytest.mark.slow
async def test_producer_gone_after_execution_drops_the_reply(aredis, keys, sim, valkey_url) -> None:
    async with running_dispatcher(aredis, keys, one_pool_group(sim.url)) as dispatcher:
        proc = start_producer(valkey_url, keys.prefix, 2500)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "submitted"
            await wait_until(lambda: len(dispatcher.running) == 1)
            proc.send_signal(signal.SIGKILL)
            proc.wait(5)
        finally:
            proc.kill()
        await wait_until(lambda: dispatcher.stats.dropped[DROP_REPLY_PRODUCER_GONE] == 1, timeout=10)
        assert dispatcher.stats.completed == 1
    assert sim.completions_total == 1
    assert await aredis.llen(keys.replies("doomed")) == 0


async def test_malformed_item_is_dropped_counted_and_next_item_served(aredis, keys, sim) -> None:
    await aredis.rpush(keys.requests("default"), b"{not json", orjson.dumps({"request_id": "x", "v": 1}))
    async with (
        running_dispatcher(aredis, keys, one_pool_group(sim.url)) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        result = await producer.submit(CALL, pool_id="default", timeout=10)
        assert result.completion["choices"]
        assert dispatcher.stats.dropped[DROP_MALFORMED] == 2
    assert await aredis.llen(keys.requests("default")) == 0


@pytest.mark.parametrize(
    "sim_hook, error",
    [
        ({"status": 500, "message": "upstream exploded"}, BackendHTTPError),
        ({"latency_ms": 3000}, BackendTimeout),
    ],
)
async def test_backend_failures_become_typed_error_replies(aredis, keys, sim, sim_hook, error) -> None:
    async with (
        running_dispatcher(aredis, keys, one_pool_group(sim.url), backend_timeout_s=0.5) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        with pytest.raises(error) as caught:
            await producer.submit({**CALL, "sim": sim_hook}, pool_id="default", timeout=10)
    if error is BackendHTTPError:
        assert "upstream exploded" in str(caught.value)
    assert dispatcher.stats.failed[error.error_type] == 1


async def test_connection_refused_becomes_typed_error(aredis, keys) -> None:
    from runtime.valkey.embedded import free_port

    config = one_pool_group(f"http://127.0.0.1:{free_port()}/v1")
    async with running_dispatcher(aredis, keys, config), Producer(aredis, keys=keys) as producer:
        with pytest.raises(BackendConnectError):
            await producer.submit(CALL, pool_id="default", timeout=10)


@pytest.mark.slow
async def test_one_slow_call_never_holds_other_slots(aredis, keys, sim) -> None:
    config = one_pool_group(sim.url, total=4, max_concurrent=4)
    async with (
        running_dispatcher(aredis, keys, config, concurrency=4),
        Producer(aredis, keys=keys) as producer,
    ):
        slow = asyncio.create_task(producer.submit(slow_call(3000), pool_id="default", timeout=10))
        await wait_until(lambda: sim.running == 1, what="the slow call running at the backend")
        started = time.monotonic()
        await asyncio.gather(*(producer.submit(CALL, pool_id="default", timeout=10) for _ in range(30)))
        assert time.monotonic() - started < 2.5
        assert not slow.done()
        await slow


async def test_expired_request_is_dropped_not_executed(aredis, keys, sim) -> None:
    async with Producer(aredis, keys=keys) as producer:
        with pytest.raises(RequestTimeout):
            await producer.submit(CALL, pool_id="default", timeout=0.2)
        async with running_dispatcher(aredis, keys, one_pool_group(sim.url)) as dispatcher:
            await wait_until(lambda: dispatcher.stats.dropped[DROP_EXPIRED] == 1)
    assert sim.completions_requested == 0


async def test_direct_mode_gives_the_same_result_shape(aredis, keys, sim) -> None:
    from runtime.backends.adapter import OpenAIBackend

    backend = OpenAIBackend(sim.url)
    async with (
        running_dispatcher(aredis, keys, one_pool_group(sim.url)),
        Producer(aredis, keys=keys) as queued,
        Producer(aredis, keys=keys, direct_backend=backend) as direct,
    ):
        via_queue = await queued.submit(CALL, pool_id="default", timeout=10)
        via_direct = await direct.submit(CALL, pool_id="default", timeout=10)
        with pytest.raises(BackendHTTPError):
            await direct.submit({**CALL, "sim": {"status": 503}}, pool_id="default", timeout=10)
    await backend.aclose()
    assert type(via_queue) is type(via_direct)
    assert via_queue.completion.keys() == via_direct.completion.keys()
    assert via_direct.timing.queue_wait_s == 0 and via_direct.timing.execution_s > 0


async def test_graceful_stop_finishes_in_flight_calls(aredis, keys, sim) -> None:
    async with Producer(aredis, keys=keys) as producer:
        async with running_dispatcher(aredis, keys, one_pool_group(sim.url)) as dispatcher:
            calls = [
                asyncio.create_task(producer.submit(slow_call(800), pool_id="default", timeout=10))
                for _ in range(5)
            ]
            await wait_until(lambda: len(dispatcher.running) == 5)
            dispatcher.request_stop()
            late = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=1.5))
        results = await asyncio.gather(*calls)
        assert all(r.completion["choices"] for r in results)
        with pytest.raises(RequestTimeout):
            await late  # submitted after stop: not taken, it stays queued
    assert await aredis.llen(keys.requests("default")) == 1


async def test_unknown_pool_and_oversized_envelope_are_refused_at_submit(aredis, keys, sim) -> None:
    async with (
        running_dispatcher(aredis, keys, one_pool_group(sim.url)),
        Producer(aredis, keys=keys, settings=ProducerSettings(max_envelope_bytes=4096)) as producer,
    ):
        with pytest.raises(UnknownPool, match="nope"):
            await producer.submit(CALL, pool_id="nope", timeout=5)
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 10_000}]}
        with pytest.raises(EnvelopeTooLarge):
            await producer.submit(big, pool_id="default", timeout=5)
    assert await aredis.llen(keys.requests("nope")) == 0
    assert await aredis.llen(keys.requests("default")) == 0


async def test_dispatcher_survives_a_valkey_restart(private_valkey, keys, sim) -> None:
    from runtime.valkey import embedded
    from runtime.valkey.client import connect

    client = connect(private_valkey.url)
    try:
        async with running_dispatcher(client, keys, one_pool_group(sim.url)) as dispatcher:
            async with Producer(client, keys=keys) as producer:
                await producer.submit(CALL, pool_id="default", timeout=10)
            embedded.stop(private_valkey.data_dir)
            await wait_until(lambda: not dispatcher.valkey_ok, timeout=10)
            # Not a wait: the scenario. The server stays down for several reconnect backoff periods.
            await asyncio.sleep(1.0)
            outages = dispatcher.stats.valkey_outages
            embedded.start(private_valkey.data_dir, port=private_valkey.port)
            await wait_until(lambda: dispatcher.valkey_ok, timeout=15)
            async with Producer(client, keys=keys) as producer:
                result = await producer.submit(CALL, pool_id="default", timeout=15)
            assert result.completion["choices"]
            assert dispatcher.stats.completed == 2
            assert outages == 1  # one outage, logged once, not a reconnect storm
    finally:
        await client.aclose()


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_a_reply_lost_with_valkey_is_counted_once_as_undelivered(private_valkey, keys, sim) -> None:
    """Lists mode: Valkey killed while a call runs and restarted (from its append-only file) only after
    the call's FINISH gave up. The reply is lost and counted ``reply_undelivered``; the lease FINISH could
    not release comes back with the file, expires and is reaped, and is not counted a second time as
    ``lost_in_flight`` (before: both, one lost call counted twice)."""
    from runtime.valkey import embedded
    from runtime.valkey.client import connect

    client = connect(private_valkey.url, health_s=1.0)
    await client.config_set("appendfsync", "always")  # the claim's lease survives the kill
    try:
        async with (
            running_dispatcher(
                client, keys, one_pool_group(sim.url), lease_s=2.0, finish_retry_s=1.0,
                reconnect_backoff_s=(0.1, 0.5),
            ) as dispatcher,
            Producer(client, keys=keys) as producer,
        ):  # fmt: skip
            call = asyncio.create_task(
                producer.submit(slow_call(500), pool_id="default", timeout=6, request_id="lost")
            )
            await wait_until(lambda: dispatcher.running, timeout=10, what="the call in flight")
            os.kill(private_valkey.pid, signal.SIGKILL)
            await wait_until(
                lambda: dispatcher.stats.dropped[DROP_REPLY_UNDELIVERED] == 1,
                timeout=15,
                what="FINISH giving up",
            )
            embedded.start(private_valkey.data_dir, port=private_valkey.port)
            checker = connect(private_valkey.url)  # no pooled connection of the killed server's
            try:

                async def reaped() -> bool:
                    return await checker.zcard(keys.group_inflight("g")) == 0  # type: ignore[no-any-return]

                await wait_until(reaped, timeout=15, what="the lease reaped")
            finally:
                await checker.aclose()
            rounds = dispatcher.stats.rounds
            await wait_until(
                lambda: dispatcher.stats.rounds >= rounds + 2, timeout=10, what="two more rounds"
            )
            assert dispatcher.stats.dropped[DROP_LOST_IN_FLIGHT] == 0
            assert dispatcher.stats.dropped[DROP_REPLY_UNDELIVERED] == 1
            assert isinstance((await asyncio.gather(call, return_exceptions=True))[0], RequestTimeout)
    finally:
        await client.aclose()


async def test_open_breaker_keeps_work_queued_until_a_probe_succeeds(aredis, keys, sim) -> None:
    from runtime.wire.backendconfig import BreakerPolicy

    policy = BreakerPolicy(failure_threshold=3, window_s=30, open_s=1.0)
    async with (
        running_dispatcher(aredis, keys, one_pool_group(sim.url), breaker=policy) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        await fail_calls(producer, 3)
        assert dispatcher.snapshot()["breakers"][sim.url]["mode"] == "open"
        calls_while_open = sim.completions_requested
        opened = time.monotonic()
        result = await producer.submit(CALL, pool_id="default", timeout=10)
        waited = time.monotonic() - opened
        assert result.completion["choices"]
        assert 0.7 <= waited <= 3.0  # it waited in its queue for the probe, not in a failing call
        assert sim.completions_requested == calls_while_open + 1
        assert dispatcher.stats.skips[("default", "breaker_open")] > 0
        assert dispatcher.snapshot()["breakers"][sim.url] == {"mode": "closed", "trips": 1}


async def test_client_errors_do_not_open_the_breaker(aredis, keys, sim) -> None:
    from runtime.wire.backendconfig import BreakerPolicy

    policy = BreakerPolicy(failure_threshold=2, open_s=30)
    async with (
        running_dispatcher(aredis, keys, one_pool_group(sim.url), breaker=policy) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        await fail_calls(producer, 3, status=400)
        await producer.submit(CALL, pool_id="default", timeout=5)
    assert dispatcher.stats.skips[("default", "breaker_open")] == 0


async def test_group_with_queueing_disabled_is_called_directly(aredis, keys, sim) -> None:
    from dataclasses import replace

    from runtime.queue import groups

    await groups.publish(aredis, keys, replace(one_pool_group(sim.url), queueing_enabled=False))
    async with Producer(aredis, keys=keys) as producer:  # no dispatcher is running at all
        result = await producer.submit(CALL, pool_id="default", timeout=5)
        with pytest.raises(UnknownPool):
            await producer.submit(CALL, pool_id="elsewhere", timeout=5)
        await groups.publish(aredis, keys, replace(one_pool_group(sim.url), version=2))

        async def producer_sees_queueing_on() -> bool:  # after its cached pool registry refreshes
            group = await producer.pool_group("default")
            return group is not None and group.queueing_enabled

        await wait_until(producer_sees_queueing_on, what="the producer reading the new configuration")
        with pytest.raises(RequestTimeout):  # queueing is back on: it waits in the queue for a dispatcher
            await producer.submit(CALL, pool_id="default", timeout=0.5)
    assert result.completion["choices"] and result.timing.queue_wait_s == 0
    assert sim.completions_total == 1
    assert await aredis.llen(keys.requests("default")) == 1


async def test_a_reply_after_the_timeout_is_counted_and_discarded(aredis, keys, sim) -> None:
    async with (
        running_dispatcher(aredis, keys, one_pool_group(sim.url)) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        with pytest.raises(RequestTimeout):
            await producer.submit(slow_call(600), pool_id="default", timeout=0.3)
        assert producer.waiting == 0  # the timed-out waiter is gone at once
        await wait_until(lambda: producer.stats.late_replies == 1, timeout=5)
        result = await producer.submit(CALL, pool_id="default", timeout=5)  # later calls are unaffected
    assert result.completion["choices"] and dispatcher.stats.completed == 1
    # The time left before the deadline bounded the slow backend call: its error reply came late, and
    # says the caller's deadline ran out (not the backend: issue 9).
    assert dispatcher.stats.failed["deadline_exceeded"] == 1
    assert await aredis.llen(keys.replies(producer.producer_id)) == 0
