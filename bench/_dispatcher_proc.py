"""One dispatcher process for the benchmarks, stopped by SIGTERM.

Usage: ``python -m bench._dispatcher_proc VALKEY_URL KEY_PREFIX GROUP_ID CONCURRENCY DISPATCHER_ID``.
Prints ``ready`` once it runs. ``BENCH_LEASE_S`` sets its in-flight lease (default: the setting's).
With ``BENCH_PROFILE=path`` it writes a cProfile (CPU time) of its whole run there; with
``BENCH_STATS=path`` it writes its CPU seconds and completions there on exit; with
``BENCH_PATH_STAMPS=path`` it stamps each call's path there (:mod:`bench._path_stamps`); with
``BENCH_TRACING=1`` it exports its spans to the Valkey span stream as ``manage.py rundispatcher`` does
(without it, its spans are OpenTelemetry's no-op ones: what history costs is left out).
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import sys
import time

import orjson

from runtime import eventloop, gc_tuning
from runtime.config import DispatcherSettings
from runtime.dispatch.dispatcher import Dispatcher
from runtime.queue.keys import KeySpace
from runtime.valkey.client import connect


async def main(url: str, prefix: str, group_id: str, concurrency: int, dispatcher_id: str) -> None:
    if os.environ.get("BENCH_PATH_STAMPS"):
        from bench import _path_stamps

        _path_stamps.install(os.environ["BENCH_PATH_STAMPS"])
    if os.environ.get("BENCH_TRACING"):
        from runtime.telemetry.tracing import configure_tracing

        configure_tracing(redis_url=url, keys=KeySpace(prefix), service_name="llm-dispatch-dispatcher")
    conn = connect(url)
    lease = {"lease_s": float(os.environ["BENCH_LEASE_S"])} if os.environ.get("BENCH_LEASE_S") else {}
    settings = DispatcherSettings(
        group_id=group_id, dispatcher_id=dispatcher_id, concurrency=concurrency, shutdown_grace_s=5.0, **lease
    )
    dispatcher = Dispatcher(conn, settings, keys=KeySpace(prefix))
    gc_tuning.tune_for_service()  # as manage.py rundispatcher does
    print("ready", flush=True)
    try:
        await dispatcher.run()
    finally:
        await conn.aclose()
    stats_path = os.environ.get("BENCH_STATS")
    if stats_path:
        with open(stats_path, "wb") as out:
            stats = dispatcher.stats
            out.write(
                orjson.dumps(
                    {
                        "cpu_s": time.process_time(),
                        "completed": stats.completed,
                        "claim_lost": stats.claim_lost,
                        "turn_busy": stats.turn_busy,
                        "stale_tokens": stats.stale_tokens,
                        "round_trips": getattr(dispatcher.queue, "trips", -1),
                        # a backend row's readings in trips of their own (older trees: none counted)
                        "backend_reads": getattr(dispatcher.fleet, "refreshes", -1),
                        "finish_trips": dispatcher.queue.finishes.batches,
                        "finishes": dispatcher.queue.finishes.calls,
                        "wake_tokens": dispatcher.waiter.tokens,
                        "rounds": stats.rounds,
                        "launched": sum(stats.launched_by_pool.values()),
                        "skips": {f"{pool}:{reason}": n for (pool, reason), n in stats.skips.items()},
                    }
                )
            )


if __name__ == "__main__":
    url, prefix, group_id, concurrency, dispatcher_id = sys.argv[1:6]
    coro = main(url, prefix, group_id, int(concurrency), dispatcher_id)
    # BENCH_LOOP=asyncio runs the default loop: the "before" side of the uvloop comparison.
    run = asyncio.run if os.environ.get("BENCH_LOOP") == "asyncio" else eventloop.run
    profile_path = os.environ.get("BENCH_PROFILE")
    if profile_path:
        profiler = cProfile.Profile(time.process_time)
        profiler.enable()
        run(coro)
        profiler.disable()
        profiler.dump_stats(profile_path)
    else:
        run(coro)
