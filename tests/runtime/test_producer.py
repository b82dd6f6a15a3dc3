"""The producer's side of a queued call against a real Valkey, with the test playing the dispatcher:
timeouts, cancellation, late and malformed replies, closing with calls in flight."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from runtime.errors import ProducerClosed, QueueFull, RequestTimeout
from runtime.producer import Producer
from runtime.queue import groups
from runtime.wire.contract import STATUS_OK, Envelope, Reply, StreamChunk
from runtime.wire.groupconfig import PoolConfig
from tests.support.dispatching import CALL, one_pool_group, wait_until

NO_BACKEND = "http://127.0.0.1:9/v1"  # nothing listens: no dispatcher runs in these tests anyway


async def take_request(aredis, keys) -> Envelope:  # type: ignore[no-untyped-def]
    _, popped = await aredis.blpop([keys.requests("default")], timeout=5)
    return Envelope.decode(popped)


async def test_a_call_without_a_reply_times_out_and_a_later_reply_is_counted_late(aredis, keys) -> None:
    await groups.publish(aredis, keys, one_pool_group(NO_BACKEND))
    async with Producer(aredis, keys=keys) as producer:
        started = asyncio.get_running_loop().time()
        with pytest.raises(RequestTimeout, match=r"got no reply within 0\.2s"):
            await producer.submit(CALL, pool_id="default", timeout=0.2)
        assert 0.2 <= asyncio.get_running_loop().time() - started < 2.0
        assert producer.waiting == 0 and producer.stats.timed_out == 1 and producer.stats.failed == 1
        envelope = await take_request(aredis, keys)
        late = Reply(envelope.request_id, STATUS_OK, completion={"choices": []})
        await aredis.rpush(keys.replies(producer.producer_id), late.encode())
        await wait_until(lambda: producer.stats.late_replies == 1, timeout=5)


async def test_a_reply_in_time_cancels_the_timeout(aredis, keys) -> None:
    await groups.publish(aredis, keys, one_pool_group(NO_BACKEND))
    async with Producer(aredis, keys=keys) as producer:
        submitted = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=0.5))
        envelope = await take_request(aredis, keys)
        reply = Reply(envelope.request_id, STATUS_OK, completion={"choices": [], "n": 1})
        await aredis.rpush(keys.replies(producer.producer_id), reply.encode())
        result = await submitted
        await asyncio.sleep(0.6)  # past the timeout: nothing fires for the answered call
    assert result.completion == {"choices": [], "n": 1}
    assert producer.stats.timed_out == 0 and producer.stats.completed == 1 and producer.stats.failed == 0


async def test_cancelling_a_queued_call_withdraws_it_from_its_list(aredis, keys) -> None:
    await groups.publish(aredis, keys, one_pool_group(NO_BACKEND))
    async with Producer(aredis, keys=keys) as producer:
        submitted = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=30))
        await wait_until(lambda: producer.waiting == 1, timeout=5)
        await wait_until(lambda: aredis.llen(keys.requests("default")), timeout=5)
        submitted.cancel()
        with pytest.raises(asyncio.CancelledError):
            await submitted
        assert producer.waiting == 0 and producer.stats.cancelled == 1 and producer.stats.timed_out == 0
    assert await aredis.llen(keys.requests("default")) == 0
    assert await aredis.hget(keys.counters("g"), "dropped:cancelled") == b"1"


async def test_a_call_cancelled_while_its_push_is_on_the_way_is_withdrawn_too(aredis, keys) -> None:
    await groups.publish(aredis, keys, one_pool_group(NO_BACKEND))
    async with Producer(aredis, keys=keys) as producer:
        submitted = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=30))
        # Turn by turn (no clock): the first turn in which the call waits is the one that sent its push,
        # whose answer cannot be back before a later turn.
        for _ in range(10_000):
            if producer.waiting:
                break
            await asyncio.sleep(0)
        submitted.cancel()
        with pytest.raises(asyncio.CancelledError):
            await submitted
        assert producer.stats.cancelled == 1
    assert await aredis.llen(keys.requests("default")) == 0  # not left behind for a dispatcher to run
    assert await aredis.hget(keys.counters("g"), "dropped:cancelled") == b"1"


async def test_a_stream_cancelled_as_its_next_chunk_arrives_stops_and_is_withdrawn(aredis, keys) -> None:
    """An ingress client that leaves while chunks keep coming: the cancellation must win over the chunk
    that arrived in the same moment (asyncio.wait_for of Python 3.11 returned the chunk instead, and the
    stream went on for nobody until the web server gave up on it ten seconds later)."""
    await groups.publish(aredis, keys, one_pool_group(NO_BACKEND))
    async with Producer(aredis, keys=keys) as producer:
        received: list[object] = []

        async def read() -> None:
            async for chunk in producer.stream(CALL, pool_id="default", timeout=30):
                received.append(chunk)

        reader = asyncio.create_task(read())
        envelope = await take_request(aredis, keys)  # running now: a withdrawal becomes a cancel notice
        first = StreamChunk(envelope.request_id, {"choices": [{"delta": {"content": "a"}}]}, queue_wait_s=0.1)
        await aredis.rpush(keys.replies(producer.producer_id), first.encode())
        await wait_until(lambda: len(received) == 1, timeout=5)
        cancels = aredis.pubsub()
        await cancels.subscribe(keys.cancel_channel("g"))
        # The race is one loop turn wide: only a delivery in the same step as the cancel pins it down.
        producer._replies.deliver(StreamChunk(envelope.request_id, {"choices": []}).encode())
        reader.cancel()
        done, _ = await asyncio.wait({reader}, timeout=5)
        assert reader in done and reader.cancelled()
        assert producer.stats.cancelled == 1

        async def cancel_notice() -> bytes | None:
            message = await cancels.get_message(ignore_subscribe_messages=True, timeout=0.1)
            return message["data"] if message else None

        notice = await wait_until(cancel_notice, timeout=5)
        await cancels.aclose()
    assert notice == envelope.request_id.encode()  # the dispatcher running it is told to cut it off


async def test_a_malformed_reply_is_counted_and_the_pump_keeps_delivering(aredis, keys) -> None:
    await groups.publish(aredis, keys, one_pool_group(NO_BACKEND))
    async with Producer(aredis, keys=keys) as producer:
        submitted = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=10))
        envelope = await take_request(aredis, keys)
        reply = Reply(envelope.request_id, STATUS_OK, completion={"choices": []})
        await aredis.rpush(
            keys.replies(producer.producer_id), b"{not json", b'{"status": "ok"}', reply.encode()
        )
        result = await submitted
    assert result.request_id == envelope.request_id
    assert producer.stats.malformed_replies == 2 and producer.stats.completed == 1


async def test_closing_fails_the_calls_in_flight(aredis, keys) -> None:
    await groups.publish(aredis, keys, one_pool_group(NO_BACKEND))
    producer = Producer(aredis, keys=keys)
    await producer.start()
    submitted = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=30))
    await wait_until(lambda: producer.waiting == 1, timeout=5)
    await take_request(aredis, keys)
    await producer.close()
    with pytest.raises(ProducerClosed):
        await submitted


async def test_admission_limits_follow_the_published_configuration(aredis, keys) -> None:
    bounded = replace(one_pool_group(NO_BACKEND), pools=(PoolConfig("default", max_queued=1),))
    await groups.publish(aredis, keys, bounded)
    async with Producer(aredis, keys=keys) as producer:
        first = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=30))
        await wait_until(lambda: aredis.llen(keys.requests("default")), timeout=5)
        with pytest.raises(QueueFull):
            await producer.submit(CALL, pool_id="default", timeout=30)
        assert producer.stats.rejected == 1
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first


async def registry_reads(aredis) -> int:  # type: ignore[no-untyped-def]
    stats = await aredis.info("commandstats")
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))


async def test_concurrent_submits_share_one_read_of_a_stale_pool_registry(aredis, keys) -> None:
    await groups.publish(aredis, keys, one_pool_group(NO_BACKEND))
    async with Producer(aredis, keys=keys) as producer:
        before = await registry_reads(aredis)
        found = await asyncio.gather(*(producer.pool_group("default") for _ in range(200)))
        assert await registry_reads(aredis) - before == 1
        assert {group.group_id for group in found if group is not None} == {"g"} and None not in found


async def test_a_cancelled_submit_does_not_cancel_the_registry_read_others_wait_for(aredis, keys) -> None:
    await groups.publish(aredis, keys, one_pool_group(NO_BACKEND))
    async with Producer(aredis, keys=keys) as producer:
        first = asyncio.create_task(producer.pool_group("default"))
        second = asyncio.create_task(producer.pool_group("default"))
        await asyncio.sleep(0)  # one loop turn: each task runs its first step (no I/O completes in it)
        assert producer._pools._reading is not None  # the first reads, the second waits for that read
        first.cancel()
        group = await second
        with pytest.raises(asyncio.CancelledError):
            await first
    assert group is not None and group.group_id == "g"
