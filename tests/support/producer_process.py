"""A producer in its own process, so a test can really kill it (SIGKILL) mid-request.

Usage: python -m tests.support.producer_process VALKEY_URL KEY_PREFIX POOL_ID LATENCY_MS ALIVE_TTL_S
Prints "submitted" once its request is queued, then waits for the reply.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import redis.asyncio as aioredis

from runtime.config import ProducerSettings
from runtime.producer import Producer
from runtime.queue.keys import KeySpace
from tests.support.waiting import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_producer(valkey_url: str, prefix: str, latency_ms: float) -> subprocess.Popen[str]:
    """Starts the producer process of pool ``default`` (liveness TTL 1 s); its stdout says "submitted"."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.producer_process",
            valkey_url,
            prefix,
            "default",
            str(latency_ms),
            "1.0",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


async def main(url: str, prefix: str, pool_id: str, latency_ms: float, ttl: float) -> None:
    client = aioredis.Redis.from_url(url)
    settings = ProducerSettings(alive_ttl_s=ttl, alive_refresh_s=ttl / 4)
    async with Producer(client, keys=KeySpace(prefix), settings=settings, producer_id="doomed") as producer:
        call = {
            "model": "sim-model",
            "messages": [{"role": "user", "content": "hi"}],
            "sim": {"latency_ms": latency_ms},
        }
        task = asyncio.create_task(producer.submit(call, pool_id=pool_id, timeout=60))
        keys = producer.keys

        async def pushed() -> bool:  # queued, or already claimed by a dispatcher (one script moves it)
            return (
                await client.llen(keys.requests(pool_id)) + await client.zcard(keys.pool_inflight(pool_id))
                > 0
            )

        await wait_until(pushed, what="the request in Valkey")
        print("submitted", flush=True)
        await task


if __name__ == "__main__":
    url, prefix, pool_id, latency, ttl = sys.argv[1:6]
    asyncio.run(main(url, prefix, pool_id, float(latency), float(ttl)))
