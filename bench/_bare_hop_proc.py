"""The floor of a queued call: a worker that answers each request over bare Valkey lists.

Usage: ``python -m bench._bare_hop_proc VALKEY_URL REQUEST_LIST [--dispatcher-client]``. Prints
``ready``, then forever: BLPOP a request (its first 32 bytes name the reply list), RPUSH it back onto
that list. Together with the caller's RPUSH and BLPOP this is one bare Valkey hop each way, in Python
with redis-py and hiredis (bench_dispatcher_cpu measures it in the same run as the queued path).
``--dispatcher-client``: the same loop on the dispatcher's own Valkey client and event loop (a
dedicated ``PipelinedConnection``, ``runtime.eventloop``): what two Valkey round trips cost a process
built as the dispatcher is, with nothing else to do. Stopped by SIGTERM.
"""

from __future__ import annotations

import sys

import redis
import redis.asyncio as aioredis

from runtime import eventloop
from runtime.valkey.client import dedicated_connection


def answer_forever(url: str, requests: str) -> None:
    conn = redis.Redis.from_url(url)
    print("ready", flush=True)
    while True:
        popped = conn.blpop([requests], timeout=1)
        if popped is not None:
            _, raw = popped
            conn.rpush(raw[:32], raw)


async def answer_forever_as_the_dispatcher(url: str, requests: str) -> None:
    conn = dedicated_connection(aioredis.Redis.from_url(url))
    await conn.execute([("PING",)])
    print("ready", flush=True)
    while True:
        (popped,) = await conn.execute([("BLPOP", requests, 1)], block_s=1)
        if popped is not None:
            _, raw = popped
            await conn.execute([("RPUSH", raw[:32], raw)])


if __name__ == "__main__":
    if "--dispatcher-client" in sys.argv[3:]:
        eventloop.run(answer_forever_as_the_dispatcher(sys.argv[1], sys.argv[2]))
    else:
        answer_forever(sys.argv[1], sys.argv[2])
