"""A Valkey that stops answering without closing its sockets (SIGSTOP: a silent partition).

Every test runs a private real server and stops it with SIGSTOP, so the kernel keeps the connections
open (and even accepts new ones into the listen backlog) while nothing answers. Before the health
check, every waiting caller hung until TCP gave up, about two hours later: the timeout markers turn
such a hang into a failure.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from runtime.errors import QueueUnavailable
from runtime.producer import CompletionResult, Producer
from runtime.valkey.client import REDIS_ERRORS, connect, dedicated_connection
from runtime.valkey.pipelined import PipelinedConnection, Target
from runtime.wire.contract import Reply
from tests.support.dispatching import one_pool_group, running_dispatcher, slow_call, wait_until
from tests.support.valkey_freeze import stopped

pytest.importorskip("hiredis")

HEALTH_S = 1.0
# The health check looks at the silence four times per HEALTH_S: a loss is found between HEALTH_S and
# 1.25 HEALTH_S after the last answer; the rest is slack for a busy machine.
DETECTED_WITHIN_S = 2.5 * HEALTH_S
TRIALS = 8


@pytest.mark.timeout(30)
async def test_batches_waiting_on_a_silent_server_fail_within_the_health_window(private_valkey) -> None:
    conn = PipelinedConnection(Target(port=private_valkey.port, health_s=HEALTH_S))
    try:
        assert await conn.execute([("SET", "k", "before")]) == [b"OK"]
        with stopped(private_valkey) as since:
            outcomes = await asyncio.gather(
                *(conn.execute([("INCR", "n")]) for _ in range(3)), return_exceptions=True
            )
            failed_after = time.monotonic() - since
        assert all(isinstance(outcome, RedisConnectionError) for outcome in outcomes), outcomes
        assert HEALTH_S <= failed_after < DETECTED_WITHIN_S
        assert conn.silences == 1 and conn.protocol is None  # dropped, not left to hang
        # Resumed: the next batch connects afresh. (The INCRs may have run: sent, never answered.)
        assert await conn.execute([("GET", "k")]) == [b"before"]
        assert conn.connects == 2
    finally:
        await conn.aclose()


@pytest.mark.timeout(30)
async def test_a_busy_connection_is_never_cut_while_answers_flow(private_valkey) -> None:
    """Silence, not latency, is the loss: a long queue of answers keeps arriving well past HEALTH_S."""
    conn = PipelinedConnection(Target(port=private_valkey.port, health_s=0.2))
    try:
        started = time.monotonic()
        while time.monotonic() - started < 1.0:
            answers = await asyncio.gather(*(conn.execute([("INCR", "n")]) for _ in range(200)))
            assert len(answers) == 200
        assert conn.silences == 0 and conn.connects == 1
    finally:
        await conn.aclose()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("protocol", [2, 3])
async def test_a_blocking_command_waits_its_block_time_and_fails_only_a_health_window_later(
    private_valkey, protocol
) -> None:
    """Dedicated connections (the wake waiter's BLPOP, the reply pump's BLMPOP): RESP2 gets a pipelined
    connection, RESP3 redis-py's; both allow block time plus HEALTH_S."""
    url = private_valkey.url
    client = (
        connect(url, health_s=HEALTH_S)
        if protocol == 2
        else aioredis.Redis.from_url(url, protocol=3, socket_timeout=HEALTH_S)
    )
    own = dedicated_connection(client)
    block_s = 2 * HEALTH_S
    try:
        # Alive, a wait longer than HEALTH_S is the command's own: answered (nothing popped), not cut.
        assert await own.execute([("BLPOP", "nothing", block_s)], block_s=block_s) == [None]
        with stopped(private_valkey) as since:
            with pytest.raises(REDIS_ERRORS):
                await own.execute([("BLPOP", "nothing", block_s)], block_s=block_s)
            failed_after = time.monotonic() - since
        assert block_s + HEALTH_S <= failed_after < block_s + DETECTED_WITHIN_S
        assert await own.execute([("PING",)]) in ([b"PONG"], [True])  # a fresh connection
    finally:
        await own.aclose()
        await client.aclose()


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_silent_valkey_fails_the_round_and_the_pump_in_seconds_and_loses_nothing(
    private_valkey, keys, sim
) -> None:
    """Real dispatcher and producer under traffic; Valkey frozen mid-traffic, then resumed."""
    dispatcher_client = connect(private_valkey.url, health_s=HEALTH_S)
    producer_client = connect(private_valkey.url, health_s=HEALTH_S)
    config = one_pool_group(sim.url, total=8, max_concurrent=8)
    try:
        async with (
            # A short lease: a claim or FINISH whose answer was lost in the partition is redelivered soon.
            running_dispatcher(
                dispatcher_client, keys, config, lease_s=3.0, reconnect_backoff_s=(0.1, 0.5)
            ) as dispatcher,
            Producer(producer_client, keys=keys) as producer,
        ):

            def submit() -> asyncio.Task[CompletionResult]:
                return asyncio.create_task(producer.submit(slow_call(200), pool_id="default", timeout=60))

            before = [submit() for _ in range(40)]
            await wait_until(lambda: dispatcher.stats.completed >= 8, timeout=20, what="traffic flowing")
            connects = dispatcher_client.pipelined.connects
            with stopped(private_valkey) as since:
                await wait_until(
                    lambda: not dispatcher.valkey_ok and producer.stats.pump_reconnects,
                    timeout=DETECTED_WITHIN_S + 1.0,
                    what="the round and the reply pump failing",
                )
                detected_after = time.monotonic() - since
                assert dispatcher.snapshot()["valkey_ok"] is False  # what the dashboard is told
                # A submit during the partition fails fast with the usual error, not after hours.
                during = [submit() for _ in range(5)]
                outcomes = await asyncio.wait_for(
                    asyncio.gather(*during, return_exceptions=True), DETECTED_WITHIN_S + 1.0
                )
                assert all(isinstance(outcome, QueueUnavailable) for outcome in outcomes), outcomes
            assert detected_after < DETECTED_WITHIN_S

            await wait_until(lambda: dispatcher.valkey_ok, timeout=10, what="the dispatcher reconnected")
            after = [submit() for _ in range(10)]
            results = await asyncio.gather(*before, *after, return_exceptions=True)
    finally:
        await dispatcher_client.aclose()
        await producer_client.aclose()

    assert dispatcher_client.pipelined.connects > connects  # the frozen connection was rebuilt
    # Every request got its reply, or its caller was told at submit that it could not be queued; none
    # timed out waiting for a reply that the partition lost.
    refused = [r for r in results if isinstance(r, QueueUnavailable)]
    assert all(isinstance(r, CompletionResult) for r in results if r not in refused), results
    assert all(isinstance(r, CompletionResult) for r in results[len(before) :])  # traffic resumed
    assert producer.stats.timed_out == 0
    assert producer.stats.failed == len(refused) + len(outcomes)
    # A refused submit may still have been queued (its push ran, the answer was cut off): its reply
    # then arrives for nobody and is counted late, never delivered to another caller.
    assert producer.stats.late_replies <= len(refused) + len(outcomes)


def test_connect_gives_every_connection_the_health_check(valkey_url) -> None:
    client = connect(valkey_url, health_s=1.5)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_keepalive"]) == (1.5, True)
    assert client.pipelined is not None and client.pipelined.target.health_s == 1.5
    own = dedicated_connection(client)
    assert isinstance(own, PipelinedConnection) and own.target.health_s == 1.5


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_replies_pushed_while_valkey_is_frozen_reach_the_producer_whose_pump_gave_up(
    private_valkey, keys
) -> None:
    """The pump's last pop, left blocked on the connection it abandoned, is served when the server
    resumes: it takes replies and answers into a socket nobody reads. Such replies must come again.

    A reply written while Valkey is frozen (a dispatcher's FINISH) is run, on resume, before the server
    notices that the pump's old connection is gone in about half the trials: several trials make the
    loss near certain before the fix."""
    client = connect(private_valkey.url, health_s=0.3)
    finisher = PipelinedConnection(Target(port=private_valkey.port, health_s=30.0))  # a patient dispatcher
    try:
        async with Producer(client, keys=keys) as producer:
            await finisher.execute([("PING",)])
            for trial in range(TRIALS):
                request_id = f"frozen-{trial}"
                submit = asyncio.create_task(
                    producer.submit(slow_call(0), pool_id="default", timeout=15, request_id=request_id)
                )
                await wait_until(lambda: client.llen(keys.requests("default")), what="the request queued")
                await client.delete(keys.requests("default"))  # taken by the "dispatcher" (this test)
                reply = Reply(request_id, "ok", completion={"id": request_id}).encode()
                gave_up = producer.stats.pump_reconnects
                with stopped(private_valkey):
                    finish = asyncio.create_task(
                        finisher.execute([("RPUSH", keys.replies(producer.producer_id), reply)])
                    )
                    await wait_until(
                        lambda gave_up=gave_up: producer.stats.pump_reconnects > gave_up,
                        timeout=5,
                        what="the pump giving up on its connection",
                    )
                await finish
                result = await submit
                assert result.completion == {"id": request_id}
    finally:
        await finisher.aclose()
        await client.aclose()
