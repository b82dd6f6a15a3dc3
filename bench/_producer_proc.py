"""One producer process for the producer-CPU benchmark: a closed loop, its own CPU per call on stdout.

Usage: ``PYTHONPATH=ROOT python bench/_producer_proc.py VALKEY_URL KEY_PREFIX CONCURRENCY CALLS TRACING``
(``TRACING`` 1: the OpenTelemetry SDK exports this producer's spans to the Valkey stream, as
``loadgen`` and the ingress do; 0: the API's no-op tracer). Prints one JSON line: ``cpu_ms`` (this
process's CPU per measured call, the span export thread included) and ``rate`` (completions/s).
"""

from __future__ import annotations

import asyncio
import sys
import time

import orjson

from bench._common import closed_loop
from runtime.producer import Producer
from runtime.queue.keys import KeySpace
from runtime.valkey.client import connect

WARM_UP_CALLS = 512


async def main(url: str, prefix: str, level: int, calls: int, tracing: bool) -> None:
    keys = KeySpace(prefix)
    provider = None
    if tracing:
        from runtime.telemetry.tracing import configure_tracing, shutdown_tracing

        provider = configure_tracing(redis_url=url, keys=keys, service_name="bench-producer")
    conn = connect(url)
    try:
        async with Producer(conn, keys=keys) as producer:
            await closed_loop(producer, "default", level, WARM_UP_CALLS)
            if provider is not None:
                provider.force_flush()
            cpu_before = time.process_time()
            _, wall = await closed_loop(producer, "default", level, calls)
            if provider is not None:
                provider.force_flush()  # the spans of the measured calls are exported inside the figure
            cpu = time.process_time() - cpu_before
    finally:
        await conn.aclose()
        if provider is not None:
            shutdown_tracing(provider)
    print(orjson.dumps({"cpu_ms": cpu * 1000 / calls, "rate": calls / wall}).decode(), flush=True)


if __name__ == "__main__":
    url, prefix, level, calls, tracing = sys.argv[1:6]
    asyncio.run(main(url, prefix, int(level), int(calls), tracing == "1"))
