"""A fair pool's queue depth (issue 22): its requests wait in its tenants' lists, not in its own."""

from __future__ import annotations

import redis.asyncio as aioredis

from pools.selectors import queue_lengths_read
from runtime.policy.admission import AdmissionLimits
from runtime.queue.keys import KeySpace
from runtime.queue.producing import ProducerOps
from runtime.queue.tenants import TenantPush


async def test_a_fair_pools_depth_counts_every_tenants_list(aredis: aioredis.Redis, keys: KeySpace) -> None:
    ops = ProducerOps(aredis, keys)
    for i, tenant in enumerate(("a", "a", "b", None)):
        await ops.push("fair", b"r%d" % i, AdmissionLimits(), tenant=TenantPush(tenant))
    await aredis.rpush(keys.requests("plain"), b"x", b"y")
    assert await aredis.llen(keys.requests("fair")) == 1  # only the untagged one
    assert queue_lengths_read(pool_ids=["fair", "plain", "empty"]) == {"fair": 4, "plain": 2, "empty": 0}
