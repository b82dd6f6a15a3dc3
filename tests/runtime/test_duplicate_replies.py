"""A producer keeps the first reply per request_id; a later one is counted and discarded."""

from __future__ import annotations

import asyncio

from runtime.producer import Producer
from runtime.queue import groups
from runtime.wire.contract import STATUS_ERROR, STATUS_OK, Envelope, Reply
from tests.support.dispatching import CALL, one_pool_group, wait_until


async def test_a_second_reply_for_an_answered_request_is_counted_and_discarded(aredis, keys) -> None:
    await groups.publish(aredis, keys, one_pool_group("http://127.0.0.1:9/v1"))
    async with Producer(aredis, keys=keys) as producer:
        submitted = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=10))
        # No dispatcher runs: the test plays one that answers the same request twice.
        _, popped = await aredis.blpop([keys.requests("default")], timeout=5)
        envelope = Envelope.decode(popped)
        first = Reply(envelope.request_id, STATUS_OK, completion={"choices": [], "n": 1})
        second = Reply(envelope.request_id, STATUS_ERROR, error_type="backend_timeout", error_message="x")
        await aredis.rpush(keys.replies(producer.producer_id), first.encode(), second.encode())
        result = await submitted
        await wait_until(lambda: producer.stats.duplicate_replies == 1, timeout=5)
    assert result.completion == {"choices": [], "n": 1}
    assert producer.stats.late_replies == 0
