"""A submit refused by admission control: QueueFull at once, nothing queued, a history row 'rejected'."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as aioredis
from opentelemetry.sdk.trace import TracerProvider

from history.ingester import Ingester
from history.queries import ExecutionFilter, executions_recent
from runtime.errors import QueueFull
from runtime.producer import Producer
from runtime.queue import groups
from runtime.queue.keys import KeySpace
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from tests.support.history_spans import drain

CALL = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}


async def test_refused_submit_raises_queues_nothing_and_is_stored_as_rejected(
    aredis: aioredis.Redis, sredis: redis.Redis, keys: KeySpace, provider: TracerProvider,
    ingester: Ingester, history,
) -> None:  # fmt: skip
    config = GroupConfig("g", pools=(PoolConfig("backfill", max_queued=2), PoolConfig("open")), version=1)
    await groups.publish(aredis, keys, config)
    await aredis.rpush(keys.requests("backfill"), b"queued-1", b"queued-2")
    async with Producer(aredis, keys=keys, tracer=provider.get_tracer("test")) as producer:
        with pytest.raises(QueueFull) as caught:
            await producer.submit(CALL, pool_id="backfill", timeout=5)
        assert producer.stats.rejected == 1 and producer.stats.failed == 0
    full = caught.value
    assert (full.reason, full.depth, full.limit, full.pool_id) == ("max_queued", 2, 2, "backfill")
    assert full.retry_after_s > 0
    assert await aredis.lrange(keys.requests("backfill"), 0, -1) == [b"queued-1", b"queued-2"]
    assert await aredis.hgetall(keys.rejections()) == {b"backfill:max_queued": b"1"}
    provider.force_flush()
    assert drain(ingester) >= 1
    [row] = executions_recent(client=history, filters=ExecutionFilter(pool="backfill")).rows
    assert (row["status"], row["error_type"], row["drop_reason"]) == ("rejected", "queue_full", "max_queued")
