"""Durable delivery and retries with real dispatcher processes, the real simulator and real Valkey.

A killed (SIGKILL) or frozen (SIGSTOP) dispatcher is a real process; the simulator counts how often
it saw each request (``sim.key``), so "the backend saw it at least once and at most twice" is measured
at the backend.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator

import pytest

from runtime.errors import BackendHTTPError, DeadLettered, DeadlineExceeded, RequestTimeout
from runtime.producer import Producer
from runtime.queue import groups
from runtime.wire.groupconfig import DURABLE, LISTS
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatcher_process import start_dispatcher, start_dispatchers, stop_dispatcher
from tests.support.dispatching import running_dispatcher, wait_until
from tests.support.durable import LEASE_S, RETRYING, counted, group, keyed


@pytest.fixture
async def backend() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(SimulatorConfig()) as server:
        yield server


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_sigkill_in_durable_mode_every_producer_gets_exactly_one_reply(
    aredis, sredis, keys, valkey_url, backend
) -> None:
    await groups.publish(aredis, keys, group(backend.url))
    doomed = start_dispatcher(valkey_url, keys.prefix, "g", "doomed", concurrency=32, lease_s=LEASE_S)
    survivor = None
    try:
        async with Producer(aredis, keys=keys) as producer:
            calls = [
                asyncio.create_task(
                    producer.submit(keyed(f"r{i}", latency_ms=2500), pool_id="default", timeout=60)
                )
                for i in range(20)
            ]
            await wait_until(lambda: len(backend.calls_by_key) == 20, timeout=20, what="20 calls in flight")
            # Killed before the survivor starts: a start-up longer than the calls' 2.5 s (seen at load
            # 6-7) would otherwise let the doomed dispatcher finish and answer them first.
            doomed.send_signal(signal.SIGKILL)
            doomed.wait(5)
            [survivor] = await start_dispatchers(
                valkey_url, keys.prefix, "g", ["survivor"], concurrency=32, lease_s=LEASE_S
            )
            results = await asyncio.gather(*calls)
            assert all(r.completion["choices"] for r in results)
            assert producer.stats.duplicate_replies == 0 and producer.stats.late_replies == 0
        seen = backend.calls_by_key
        assert len(seen) == 20 and all(1 <= n <= 2 for n in seen.values()), seen
        assert sum(seen.values()) == 40  # the killed dispatcher replied to none: each ran again once
        # No slot leaks beyond one lease: every lease is released once the calls are done.
        assert await aredis.zcard(keys.group_inflight("g")) == 0
        await wait_until(
            lambda: counted(sredis, keys, "requeued") == 20, timeout=10, what="20 requeues counted"
        )
    finally:
        for proc in (doomed, survivor):
            if proc is not None:
                stop_dispatcher(proc)


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_dispatcher_frozen_past_its_lease_cannot_reply_and_its_attempts_are_counted(
    aredis, sredis, keys, valkey_url, backend
) -> None:
    await groups.publish(aredis, keys, group(backend.url))
    frozen = start_dispatcher(valkey_url, keys.prefix, "g", "frozen", concurrency=8, lease_s=LEASE_S)
    finisher = None
    try:
        async with Producer(aredis, keys=keys) as producer:
            calls = [
                asyncio.create_task(
                    producer.submit(keyed(f"s{i}", latency_ms=1500), pool_id="default", timeout=60)
                )
                for i in range(5)
            ]
            await wait_until(lambda: len(backend.calls_by_key) == 5, timeout=20, what="5 calls in flight")
            frozen.send_signal(signal.SIGSTOP)
            [finisher] = await start_dispatchers(
                valkey_url, keys.prefix, "g", ["finisher"], concurrency=8, lease_s=LEASE_S
            )
            results = await asyncio.gather(*calls)  # the finisher ran them again once the lease expired
            assert all(r.completion["choices"] for r in results)
            assert all(n == 2 for n in backend.calls_by_key.values())
            frozen.send_signal(
                signal.SIGCONT
            )  # its own calls have answered meanwhile: it tries to finish them

            await wait_until(
                lambda: counted(sredis, keys, "dropped:stale_attempt") == 5,
                timeout=20,
                what="5 stale attempts",
            )
            assert producer.stats.duplicate_replies == 0 and producer.stats.late_replies == 0
            assert await aredis.llen(keys.replies(producer.producer_id)) == 0
    finally:
        for proc in (frozen, finisher):
            if proc is not None:
                proc.send_signal(signal.SIGCONT)
                stop_dispatcher(proc)


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_sigkill_in_lists_mode_loses_the_calls_counts_them_and_runs_nothing_again(
    aredis, sredis, keys, valkey_url, backend
) -> None:
    await groups.publish(aredis, keys, group(backend.url, delivery=LISTS))
    doomed = start_dispatcher(valkey_url, keys.prefix, "g", "doomed", concurrency=32, lease_s=LEASE_S)
    survivor = None
    try:
        async with Producer(aredis, keys=keys) as producer:
            calls = [
                asyncio.create_task(
                    producer.submit(keyed(f"l{i}", latency_ms=2500), pool_id="default", timeout=LEASE_S + 4)
                )
                for i in range(5)
            ]
            await wait_until(lambda: len(backend.calls_by_key) == 5, timeout=20, what="5 calls in flight")
            # Killed before the survivor starts: a start-up longer than the calls' 2.5 s (seen at load
            # 6-7) would otherwise let the doomed dispatcher finish and answer them first.
            doomed.send_signal(signal.SIGKILL)
            doomed.wait(5)
            [survivor] = await start_dispatchers(
                valkey_url, keys.prefix, "g", ["survivor"], concurrency=32, lease_s=LEASE_S
            )
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            assert all(isinstance(o, RequestTimeout) for o in outcomes), outcomes
            await wait_until(
                lambda: counted(sredis, keys, "dropped:lost_in_flight") == 5,
                timeout=10,
                what="5 losses counted",
            )
        assert all(n == 1 for n in backend.calls_by_key.values())  # nothing ran again
        assert counted(sredis, keys, "requeued") == 0
        assert await aredis.llen(keys.requests("default")) == 0
    finally:
        for proc in (doomed, survivor):
            if proc is not None:
                stop_dispatcher(proc)


@pytest.mark.parametrize("delivery", [LISTS, DURABLE])
async def test_two_503s_then_success_retries_through_the_delayed_set(
    aredis, keys, backend, spans, delivery
) -> None:
    provider, exporter = spans
    config = group(backend.url, delivery=delivery, **RETRYING)
    tracer = provider.get_tracer("llm_dispatch.dispatcher")
    async with (
        running_dispatcher(aredis, keys, config, tracer=tracer) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        result = await producer.submit(keyed("r", status=503, fail_times=2), pool_id="default", timeout=20)
    assert result.completion["choices"]
    assert backend.calls_by_key == {"r": 3}
    attempts = [
        (
            s.attributes["llm_dispatch.attempt"],
            s.attributes["llm_dispatch.status"],
            s.attributes.get("error.type"),
        )
        for s in sorted(exporter.get_finished_spans(), key=lambda s: s.end_time or 0)
        if s.attributes and s.attributes.get("llm_dispatch.request_id") == result.request_id
    ]
    assert attempts == [
        (1, "retry", "backend_http_error"),
        (2, "retry", "backend_http_error"),
        (3, "ok", None),
    ]
    assert dispatcher.stats.retried == 2 and dispatcher.stats.completed == 1
    assert await aredis.zcard(keys.delayed("default")) == 0


async def test_exhausted_attempts_become_a_dead_letter_and_a_typed_error(aredis, keys, backend) -> None:
    config = group(backend.url, **{**RETRYING, "max_attempts": 2})
    async with (
        running_dispatcher(aredis, keys, config) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        with pytest.raises(DeadLettered, match="attempts_exhausted after 2 attempt"):
            await producer.submit(keyed("d", status=503), pool_id="default", timeout=20)
    assert backend.calls_by_key == {"d": 2}
    [raw] = await aredis.lrange(keys.dead_letters("default"), 0, -1)
    from runtime.dispatch.deadletters import DeadLetter

    letter = DeadLetter.decode(raw)
    assert (letter.reason, letter.error_type, letter.attempts) == (
        "attempts_exhausted",
        "backend_http_error",
        2,
    )
    assert dispatcher.stats.dead_lettered == 1


async def test_a_400_and_a_callers_deadline_never_retry(aredis, keys, backend) -> None:
    config = group(backend.url, **RETRYING)
    async with (
        running_dispatcher(aredis, keys, config) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        with pytest.raises(BackendHTTPError):
            await producer.submit(keyed("bad", status=400), pool_id="default", timeout=20)
        # Whichever comes first: the producer's own timeout, or the dispatcher's deadline_exceeded reply.
        with pytest.raises((RequestTimeout, DeadlineExceeded)):
            await producer.submit(keyed("slow", latency_ms=3000), pool_id="default", timeout=0.6)
        await wait_until(lambda: dispatcher.stats.failed["deadline_exceeded"] == 1, timeout=10)
    assert backend.calls_by_key == {"bad": 1, "slow": 1}
    assert dispatcher.stats.retried == 0 and dispatcher.stats.dead_lettered == 0
    assert await aredis.zcard(keys.delayed("default")) == 0
    assert await aredis.llen(keys.dead_letters("default")) == 0


async def test_a_dispatcher_that_reaped_its_own_lease_gets_it_back_while_the_call_runs(
    aredis, sredis, keys, backend
) -> None:
    """A starved dispatcher (a loaded machine) misses its renewals and its own REAP takes its lease:
    lists mode, nothing requeued. Before, the call then counted in no cap and, had the dispatcher died
    before the call ended, nobody would have counted it lost: its record was gone."""
    async with (
        running_dispatcher(aredis, keys, group(backend.url, delivery=LISTS), lease_s=LEASE_S) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        call = asyncio.create_task(producer.submit(keyed("starved", latency_ms=6000), pool_id="default"))
        await wait_until(lambda: dispatcher.running, what="the call running")
        [member] = dispatcher.running

        async def starved(leases, lease_s) -> None:  # the renewals a starved process misses
            return None

        dispatcher.queue.renew = starved  # type: ignore[method-assign]
        first = await aredis.zscore(keys.group_inflight("g"), member)

        async def given_back() -> bool:  # expired, reaped, and leased again: only RELET moves it on
            score = await aredis.zscore(keys.group_inflight("g"), member)
            return score is not None and score > first + 0.5

        await wait_until(given_back, timeout=2 * LEASE_S, what="the reaped lease given back")
        assert await aredis.hexists(keys.lease_records("g"), member)
        assert (await call).completion
    assert counted(sredis, keys, "dropped:lost_in_flight") == 0
