"""Diagnostic: does one producer with thousands of calls outstanding lose replies (branch pump-stall)?

Usage: ``python -m bench.pump_stall [--fairness off|tokens] [--outstanding 4000] [--seconds 20]
[--busy N]``. Starts a private Valkey, the simulator (zero latency) and one dispatcher (64 slots, its
log to ``/tmp/pump_stall_dispatcher.log``), keeps ``outstanding`` submits in flight from ONE producer
(closed loop, 1,000 tenants) for ``seconds``, with ``busy`` CPU busy loops of its own started and
killed around the run. Prints once a second: completions, the pump's reconnects, and the reply,
taken, request and in-flight sizes; then stops resubmitting, gives the calls out 30 s to come back
and prints what is left (unanswered calls and every list) at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import redis

from bench._common import (
    ROOT,
    client,
    group,
    new_keys,
    private_valkey_server,
    publish,
    simulator_proc,
    stops_with_this_process,
)
from runtime.producer import Producer
from runtime.wire.groupconfig import GroupConfig, PoolConfig

POOL = "chat"
SLOTS = 64
DRAIN_S = 30.0
STATS = "/tmp/pump_stall_dispatcher.json"


class _AliveWatch(threading.Thread):
    """Polls the producer's liveness marker from a thread of its own (the producer's loop may be stalled)
    and prints each span of time it was missing while the producer ran."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.conn, self.key, self.halt = redis.Redis.from_url(url), key, threading.Event()
        self.start()

    def run(self) -> None:
        t0, missing_since = time.perf_counter(), None
        while not self.halt.wait(0.1):
            now = time.perf_counter() - t0
            if not self.conn.exists(self.key):
                missing_since = now if missing_since is None else missing_since
            elif missing_since is not None:
                print(f"  liveness marker MISSING from {missing_since:.1f}s to {now:.1f}s", flush=True)
                missing_since = None

    def stop(self) -> None:
        self.halt.set()
        self.join()


def _config(url: str, fairness: str) -> GroupConfig:
    return group(
        url, [PoolConfig(POOL, max_concurrent=SLOTS, tenant_fairness=fairness)], total=SLOTS, group_id="t"
    )


def _call(i: int) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": f"request {i}"}],
        "max_tokens": 16,
        "sim": {"latency_ms": 0, "completion_tokens": 16},
    }


async def _state(producer: Producer) -> dict[str, int]:
    conn, keys, pid = producer.client, producer.keys, producer.producer_id
    return {
        "replies": int(await conn.llen(keys.replies(pid))),
        "taken": int(await conn.llen(keys.replies_taken(pid))),
        "requests": int(await conn.llen(keys.requests(POOL))),
        "queued": int(await conn.get(keys.pool_queued(POOL)) or 0),
        "inflight": int(await conn.zcard(keys.pool_inflight(POOL))),
    }


def _chain(coro: Any) -> list[str]:
    """Where a coroutine waits: each frame down its ``cr_await`` chain (Task.get_stack stops at the top)."""
    names = []
    while coro is not None and hasattr(coro, "cr_frame"):
        frame = coro.cr_frame
        names.append(f"{frame.f_code.co_name}:{frame.f_lineno}" if frame else "?")
        coro = coro.cr_await
    names.append(repr(coro)[:120])
    return names


async def _dump(producer: Producer) -> None:
    """Every key of the run with its type and size, for the stall's post-mortem."""
    conn = producer.client
    sizes = {"list": conn.llen, "zset": conn.zcard, "hash": conn.hlen, "set": conn.scard}
    tenant_lists, tenant_items = 0, 0
    async for key in conn.scan_iter(count=1000):
        kind = (await conn.type(key)).decode()
        size = int(await sizes[kind](key)) if kind in sizes else -1
        if b"tenant-requests" in key:
            tenant_lists, tenant_items = tenant_lists + 1, tenant_items + size
            continue
        print(f"  {key!r} {kind} {size}")
    print(f"  tenant lists: {tenant_lists} holding {tenant_items}", flush=True)
    print(f"  counters: {await conn.hgetall(producer.keys.counters('t'))}", flush=True)
    stats = await conn.info("commandstats")
    print("  calls:", {k: v["calls"] for k, v in stats.items() if v["calls"] > 50}, flush=True)


async def run(fairness: str, outstanding: int, seconds: float, busy: int) -> dict[str, Any]:
    with private_valkey_server() as server, simulator_proc() as sim:
        keys = new_keys()
        async with client(server.url) as conn:
            await publish(conn, keys, _config(sim, fairness))
            with open("/tmp/pump_stall_dispatcher.log", "w") as log_file:
                args = ["-m", "bench._dispatcher_proc", server.url, keys.prefix, "t", f"{SLOTS}", "d0"]
                proc = subprocess.Popen(
                    [sys.executable, *args],
                    cwd=ROOT, stdout=subprocess.PIPE, stderr=log_file, text=True, start_new_session=True,
                    env={**os.environ, "PYTHONPATH": str(ROOT), "BENCH_STATS": STATS},
                    preexec_fn=stops_with_this_process(),
                )  # fmt: skip
                assert proc.stdout is not None and "ready" in proc.stdout.readline()
                loops = [
                    subprocess.Popen(
                        [sys.executable, "-c", "while 1: pass"], preexec_fn=stops_with_this_process()
                    )
                    for _ in range(busy)
                ]
                try:
                    async with Producer(conn, keys=keys) as producer:
                        watch = _AliveWatch(server.url, producer.keys.producer_alive(producer.producer_id))
                        try:
                            return await _drive(producer, outstanding, seconds)
                        finally:
                            watch.stop()
                finally:
                    for loop in loops:
                        loop.kill()
                        loop.wait()
                    os.kill(proc.pid, signal.SIGTERM)
                    proc.wait(15)
                    with contextlib.suppress(FileNotFoundError), open(STATS) as stats:
                        print(f"dispatcher: {stats.read()}", flush=True)


async def _drive(producer: Producer, outstanding: int, seconds: float) -> dict[str, Any]:
    done, stop, errors = 0, False, 0

    async def worker(w: int) -> None:
        nonlocal done, errors
        i = w
        while not stop:
            try:
                await producer.submit(_call(i), pool_id=POOL, timeout=300, tenant=f"t{w % 1000}")
            except Exception:  # counted: a timeout or a failure is an answer too
                errors += 1
            i += outstanding
            done += 1

    # The loop's stall: how late a 0.25 s timer fires at worst (the liveness refresh is such a timer).
    loop, lag = asyncio.get_running_loop(), {"worst": 0.0}

    def tick(due: float) -> None:
        lag["worst"] = max(lag["worst"], loop.time() - due)
        loop.call_at(loop.time() + 0.25, tick, loop.time() + 0.25)

    tick(loop.time())
    workers = [asyncio.create_task(worker(w)) for w in range(outstanding)]
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        await asyncio.sleep(1)
        state = await _state(producer)
        at, worst, reconnects = time.perf_counter() - t0, lag["worst"], producer.stats.pump_reconnects
        print(f"{at:5.1f}s done={done} timer-lag={worst:.1f}s reconnects={reconnects} {state}", flush=True)
    stop = True
    left = time.perf_counter()
    pending = set(workers)
    while pending and time.perf_counter() - left < DRAIN_S:
        _, pending = await asyncio.wait(pending, timeout=2)
        state = await _state(producer)
        print(f"drain {time.perf_counter() - left:4.1f}s out={len(pending)} {state}", flush=True)
    for task in list(pending)[:2]:
        print("  awaiting:", " > ".join(_chain(task.get_coro())), flush=True)
    print(f"  waiters={len(producer._waiters)}", flush=True)
    await _dump(producer)
    for task in pending:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    return {
        "done": done,
        "errors": errors,
        "unanswered": len(pending),
        "pump_reconnects": producer.stats.pump_reconnects,
        "late": producer.stats.late_replies,
        **await _state(producer),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fairness", default="off", choices=("off", "tokens"))
    parser.add_argument("--outstanding", type=int, default=4000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--busy", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    print(f"load: {os.getloadavg()}", flush=True)
    print(asyncio.run(run(args.fairness, args.outstanding, args.seconds, args.busy)), flush=True)


if __name__ == "__main__":
    main()
