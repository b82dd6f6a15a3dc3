"""The floor of a queued call: a worker that answers each request over bare Valkey lists.

Usage: ``python -m bench._bare_hop_proc VALKEY_URL REQUEST_LIST``. Prints ``ready``, then forever:
BLPOP a request (its first 32 bytes name the reply list), RPUSH it back onto that list. Together with
the caller's RPUSH and BLPOP this is one bare Valkey hop each way, in Python with redis-py and hiredis
(bench_dispatcher_cpu measures it in the same run as the queued path). Stopped by SIGTERM.
"""

from __future__ import annotations

import sys

import redis


def main(url: str, requests: str) -> None:
    conn = redis.Redis.from_url(url)
    print("ready", flush=True)
    while True:
        popped = conn.blpop([requests], timeout=1)
        if popped is not None:
            _, raw = popped
            conn.rpush(raw[:32], raw)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
