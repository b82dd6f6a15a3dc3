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

from runtime.dispatch import redelivery
from runtime.errors import QueueUnavailable
from runtime.policy.admission import AdmissionLimits
from runtime.producer import CompletionResult, Producer
from runtime.queue import scripts
from runtime.queue.dispatching import ClaimRequest, QueueOps, lease_member, reap_args
from runtime.queue.keys import KeySpace
from runtime.queue.leases import LeaseRecord
from runtime.queue.producing import ProducerOps
from runtime.queue.registry import script
from runtime.queue.tenant_dispatch import FairPick
from runtime.queue.tenants import TenantPush
from runtime.valkey.client import REDIS_ERRORS, connect, dedicated_connection
from runtime.valkey.lua import run_pipeline
from runtime.valkey.pipelined import PipelinedConnection, Target
from runtime.wire.contract import ChatCall, Envelope, Reply
from tests.support.dispatching import one_pool_group, running_dispatcher, slow_call, wait_until
from tests.support.queueing import call
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


async def _queued_one(client: aioredis.Redis, keys: KeySpace) -> tuple[Envelope, bytes]:
    envelope = Envelope(
        request_id="r1", producer_id="p", pool_id="a", call=ChatCall.from_openai(call("a", 1)),
        enqueued_at=time.time(),
    )  # fmt: skip
    raw = envelope.encode()
    await client.rpush(keys.requests("a"), raw)
    await client.set(keys.producer_alive("p"), b"1", px=60_000)
    return envelope, raw


def _launch_of(envelope: Envelope, raw: bytes, *, durable: bool) -> ClaimRequest:
    record = LeaseRecord.encode_of(envelope, pool_id="a", claimed_at=time.time(), dispatcher_id="d1", cost=1)
    return ClaimRequest(
        pool_id="a", raw=raw, mode="launch", lease_member=lease_member("a", envelope.request_id),
        producer_id="p", pool_max=4, group_limit=4, lease_record=record,
        requeue=redelivery.requeued(envelope).encode() if durable else b"", backend_id="b", backend_limit=4,
    )  # fmt: skip


async def _warm_up(queue: QueueOps) -> None:
    [(code, _, _)] = await queue.claim([ClaimRequest(pool_id="a", raw=b"not the head", mode="drop")], 30.0)
    assert code == scripts.CLAIM_MOVED


async def _claim_cut_off(server, client: aioredis.Redis, queue: QueueOps, claim: ClaimRequest) -> None:  # type: ignore[no-untyped-def]
    """A real claim pipeline sent into a frozen Valkey and cut by the health check; Valkey resumed.
    The claim script is loaded first, as on a dispatcher that has claimed before (a NOSCRIPT would run
    nothing)."""
    await _warm_up(queue)
    with stopped(server), pytest.raises(REDIS_ERRORS):
        await queue.claim([claim], lease_s=30.0)
    assert queue.unanswered  # remembered, to be reconciled once Valkey answers


async def _until_claimed(client: aioredis.Redis, requests: str) -> None:
    deadline = time.monotonic() + 5.0
    while await client.llen(requests):
        assert time.monotonic() < deadline, "the cut-off claim never ran"
        await asyncio.sleep(0.01)


async def _leases(client: aioredis.Redis, keys: KeySpace) -> list[int]:
    return [
        await client.zcard(keys.group_inflight("g")), await client.zcard(keys.pool_inflight("a")),
        await client.zcard(keys.backend_inflight("b")), await client.hlen(keys.lease_records("g")),
        await client.hlen(keys.lease_tokens("g")), await client.hlen(keys.durable_leases("g")),
    ]  # fmt: skip


@pytest.mark.timeout(30)
@pytest.mark.parametrize("durable", [False, True])
async def test_a_claim_whose_answer_was_lost_but_ran_is_given_back_not_lost(private_valkey, durable) -> None:
    """The claim's bytes were in the frozen Valkey's socket buffer: resumed, it runs, and the request is
    a lease of a call that never started. Given back, it is queued again with no trace of the lease,
    so REAP neither counts it lost in flight (lists mode) nor requeues a second copy (durable)."""
    client = connect(private_valkey.url, health_s=HEALTH_S)
    keys = KeySpace("t:")
    try:
        queue = QueueOps(client, keys, "g")
        envelope, raw = await _queued_one(client, keys)
        await _claim_cut_off(private_valkey, client, queue, _launch_of(envelope, raw, durable=durable))
        # Resumed: the cut-off claim runs after all (this is the loss the give-back repairs), soon but
        # not always before a new connection's first command.
        await _until_claimed(client, keys.requests("a"))
        assert await _leases(client, keys) == [1, 1, 1, 1, 1 if durable else 0, 1 if durable else 0]

        assert await queue.give_back_unanswered(30.0) == 1
        assert await client.lrange(keys.requests("a"), 0, -1) == [raw]
        assert await _leases(client, keys) == [0, 0, 0, 0, 0, 0]
        assert not queue.unanswered and await queue.give_back_unanswered(30.0) == 0
        reap = script("reap")
        [(lost, requeued)] = await run_pipeline(
            client, [reap], lambda pipe: reap.queue(pipe, *reap_args(keys, "g", ["a"], ["b"]))
        )
        assert (lost, requeued) == ([], [])
        # The request claims again as any queued one (no duplicate lease left behind).
        [(code, _, _)] = await queue.claim([_launch_of(envelope, raw, durable=durable)], lease_s=30.0)
        assert code == scripts.CLAIMED
    finally:
        await client.aclose()


@pytest.mark.timeout(30)
async def test_a_durable_lease_reaped_before_its_give_back_is_queued_once(private_valkey) -> None:
    """REAP requeued the expired durable lease first: the give-back finds the lease gone and does
    nothing (atomic with that check), so the request is queued exactly once."""
    client = connect(private_valkey.url, health_s=HEALTH_S)
    keys = KeySpace("t:")
    try:
        queue = QueueOps(client, keys, "g")
        envelope, raw = await _queued_one(client, keys)
        claim = _launch_of(envelope, raw, durable=True)
        await _warm_up(queue)
        with stopped(private_valkey), pytest.raises(REDIS_ERRORS):
            await queue.claim([claim], lease_s=0.2)  # expires right after Valkey resumes
        await asyncio.sleep(0.3)
        reap = script("reap")
        [(lost, requeued)] = await run_pipeline(
            client, [reap], lambda pipe: reap.queue(pipe, *reap_args(keys, "g", ["a"], ["b"]))
        )
        assert (lost, len(requeued)) == ([], 1)
        assert await queue.give_back_unanswered(30.0) == 0
        assert await client.lrange(keys.requests("a"), 0, -1) == [redelivery.requeued(envelope).encode()]
        assert await _leases(client, keys) == [0, 0, 0, 0, 0, 0]
    finally:
        await client.aclose()


@pytest.mark.timeout(60)
async def test_a_dispatcher_runs_the_request_of_a_claim_that_ran_after_its_answer_was_lost(
    private_valkey, keys, sim
) -> None:
    """End to end: the dispatcher's own claim pipeline is cut off in a freeze and runs on resume; its
    next round gives the request back and runs it, rather than its lease expiring as lost in flight."""
    dispatcher_client = connect(private_valkey.url, health_s=HEALTH_S)
    producer_client = connect(private_valkey.url, health_s=HEALTH_S)
    config = one_pool_group(sim.url, total=8, max_concurrent=8)
    try:
        async with (
            # No idle poll in the test's time: the push and the lease renewal bring the rounds after it.
            running_dispatcher(
                dispatcher_client, keys, config, lease_s=3.0, idle_poll_s=60.0, reconnect_backoff_s=(0.1, 0.5)
            ) as dispatcher,
            Producer(producer_client, keys=keys) as producer,
        ):
            envelope = Envelope(
                request_id="cut-off", producer_id="p", pool_id="default",
                call=ChatCall.from_openai(call("default", 1)), enqueued_at=time.time(),
            )  # fmt: skip
            raw = envelope.encode()
            await producer_client.set(keys.producer_alive("p"), b"1", px=60_000)
            await producer_client.rpush(keys.requests("default"), raw)  # no wake token: no round takes it
            record = LeaseRecord.encode_of(
                envelope, pool_id="default", claimed_at=time.time(),
                dispatcher_id=dispatcher.identity.dispatcher_id, cost=1,
            )  # fmt: skip
            claim = ClaimRequest(
                pool_id="default", raw=raw, mode="launch", lease_member=lease_member("default", "cut-off"),
                producer_id="p", pool_max=8, group_limit=8, lease_record=record,
            )  # fmt: skip
            await _claim_cut_off(private_valkey, dispatcher_client, dispatcher.queue, claim)
            # It ran on resume: a lease of ours, unless the dispatcher's own round, on a new
            # connection, claimed the request first (then the cut-off claim found it gone).
            await _until_claimed(producer_client, keys.requests("default"))
            # A push wakes the dispatcher; its round (or its lease renewal) gives the request back.
            result = await producer.submit(slow_call(0), pool_id="default", timeout=20)
            assert isinstance(result, CompletionResult)
            await wait_until(
                lambda: dispatcher.stats.completed >= 2, timeout=10, what="the cut-off request run"
            )
            assert dispatcher.stats.claims_given_back <= 1
            await asyncio.sleep(3.5)  # past the lease the cut-off claim took: a reap finds nothing lost
            await wait_until(lambda: dispatcher.valkey_ok, timeout=5, what="the dispatcher answered")
            assert not dispatcher.stats.lost_by_pool
            assert await producer_client.llen(keys.replies("p")) == 1
    finally:
        await dispatcher_client.aclose()
        await producer_client.aclose()


@pytest.mark.timeout(30)
async def test_a_fair_pools_claim_given_back_returns_to_its_tenant_with_its_charge_refunded(
    private_valkey,
) -> None:
    """A fair pool's cut-off claim popped the tenant's list, lowered the pool's queued count, charged
    the tenant and took it out of the backlogged set; the give-back undoes each of those."""
    client = connect(private_valkey.url, health_s=HEALTH_S)
    keys = KeySpace("t:")
    try:
        queue = QueueOps(client, keys, "g")
        envelope = Envelope(
            request_id="r1", producer_id="p", pool_id="a", call=ChatCall.from_openai(call("a", 1)),
            enqueued_at=time.time(), tenant="acme",
        )  # fmt: skip
        raw = envelope.encode()
        await client.set(keys.producer_alive("p"), b"1", px=60_000)
        await ProducerOps(client, keys).push("a", raw, AdmissionLimits(), tenant=TenantPush("acme"))
        # Another tenant stays backlogged: the floor acme comes back to is its counter, not acme's own.
        other = Envelope(
            request_id="r2", producer_id="p", pool_id="a", call=ChatCall.from_openai(call("a", 2)),
            enqueued_at=time.time(), tenant="other",
        ).encode()  # fmt: skip
        await ProducerOps(client, keys).push("a", other, AdmissionLimits(), tenant=TenantPush("other"))
        counter = float(await client.hget(keys.tenant_counters("a"), "acme"))
        queue.fair_pools = frozenset({"a"})
        queue.fair_picks["a"] = {raw: FairPick("acme", 5.0)}
        await _claim_cut_off(private_valkey, client, queue, _launch_of(envelope, raw, durable=False))
        await _until_claimed(client, keys.tenant_requests("a", "acme"))
        assert float(await client.hget(keys.tenant_counters("a"), "acme")) == counter + 5.0  # charged
        assert await client.zscore(keys.tenants("a"), "acme") is None  # left: its list is empty
        assert int(await client.get(keys.pool_queued("a"))) == 1

        assert await queue.give_back_unanswered(30.0) == 1
        assert await client.lrange(keys.tenant_requests("a", "acme"), 0, -1) == [raw]
        assert int(await client.get(keys.pool_queued("a"))) == 2
        assert float(await client.hget(keys.tenant_counters("a"), "acme")) == counter  # refunded
        assert await client.zscore(keys.tenants("a"), "acme") == counter  # backlogged again
        assert await _leases(client, keys) == [0, 0, 0, 0, 0, 0]
    finally:
        await client.aclose()
