"""A producer streaming one call in its own process, so a test can SIGKILL it mid-stream.

Usage: python -m tests.support.stream_process VALKEY_URL KEY_PREFIX POOL_ID ALIVE_TTL_S
Prints "chunk" for each chunk received.
"""

from __future__ import annotations

import asyncio
import sys

from runtime.config import ProducerSettings
from runtime.producer import Producer
from runtime.queue.keys import KeySpace
from runtime.valkey.client import connect


async def main(url: str, prefix: str, pool_id: str, ttl: float) -> None:
    settings = ProducerSettings(alive_ttl_s=ttl, alive_refresh_s=ttl / 4)
    async with Producer(connect(url), keys=KeySpace(prefix), settings=settings) as producer:
        call = {
            "model": "sim-model",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 400,
            "sim": {"itl_ms": 100, "completion_tokens": 400},
        }
        async for _ in producer.stream(call, pool_id=pool_id, timeout=60):
            print("chunk", flush=True)


if __name__ == "__main__":
    url, prefix, pool_id, ttl = sys.argv[1:5]
    asyncio.run(main(url, prefix, pool_id, float(ttl)))
