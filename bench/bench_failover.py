"""A Valkey failover under load: SIGKILL the primary behind Sentinel and watch the traffic come back.

Run: ``python bench/bench_failover.py [--quick] [--runs N] [--delivery durable|lists]
[--persist-replicas N]``.

A primary, two replicas and three sentinels (``down-after-milliseconds`` 1000, ``failover-timeout``
2000) from the embedded ``valkey-server``, each with an append-only file (tests/support/sentinel_cluster.py);
one ``bench._dispatcher_proc`` dispatcher (lease ``LEASE_S``) and ``WORKERS`` closed-loop producer
workers in this process, all given the ``valkey+sentinel://`` URL; the simulator in this process
answers each call after ``LATENCY_MS``. After ``WARMUP_S`` the primary is SIGKILLed; nothing restarts.

Reported: completions per second, second by second, around the kill; the time from the kill to the
first completion of a request submitted after it (so pushed to, and answered through, the new primary);
and acknowledged requests lost: a submit whose push Valkey acknowledged (it did not fail with
QueueUnavailable) and that never got a reply (RequestTimeout). The durable group waits for a replica on
each push (``persist_replicas`` 1 unless ``--persist-replicas`` says otherwise; WAITAOF): without it a
push acknowledged just before the kill can die with the primary (replication is asynchronous).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import client, dispatcher_procs, group, machine, median, new_keys, publish, run_benchmark
from runtime.errors import DispatchError
from runtime.producer import Producer
from runtime.wire.groupconfig import DURABLE, LISTS, PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.sentinel_cluster import DOWN_AFTER_MS, SentinelCluster

WORKERS = 32
LATENCY_MS = 50
LEASE_S = 3.0
WARMUP_S = 3.0
AFTER_S = 10.0
# Short, so a closed-loop worker whose request was lost (lists mode) submits again within the window.
REQUEST_TIMEOUT_S = 6.0
DELIVERY = DURABLE
PERSIST_REPLICAS = 1  # a durable push waits for this many replicas (persist_replicas)


@dataclasses.dataclass
class Run:
    completions: list[float]  # seconds since the kill, one per completion
    first_after_kill_s: float
    acknowledged_lost: int
    counted_lost: dict[str, int]  # what the dispatchers counted, by drop reason
    refused: int  # QueueUnavailable: never acknowledged, the caller knows to retry
    duplicates: int


async def one_run(delivery: str) -> Run:
    keys = new_keys()
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as root:
        # Two replicas: the promoted one still has a replica to wait for (persist_replicas=1).
        cluster = SentinelCluster(Path(root), replicas=2)
        try:
            cluster.start()
            return await _under_load(cluster, keys, delivery)
        finally:
            cluster.stop()


async def _under_load(cluster: SentinelCluster, keys, delivery: str) -> Run:  # type: ignore[no-untyped-def]
    async with SimulatorServer(SimulatorConfig()) as sim, client(cluster.url) as conn:
        config = dataclasses.replace(
            group(sim.url, [PoolConfig("default", max_concurrent=64)], policy="fifo", total=64),
            delivery=delivery,
            persist_replicas=PERSIST_REPLICAS if delivery == DURABLE else 0,
        )
        await publish(conn, keys, config)
        env = {"BENCH_LEASE_S": str(LEASE_S)}
        with dispatcher_procs(cluster.url, keys.prefix, config.group_id, 1, 64, env=env):
            async with Producer(conn, keys=keys) as producer:
                done: list[float] = []
                started_after: list[float] = []  # completion times of requests submitted after the kill
                outcomes: collections.Counter[str] = collections.Counter()
                stop = asyncio.Event()
                killed_at = [float("inf")]

                async def worker(w: int) -> None:
                    i = 0
                    while not stop.is_set():
                        i += 1
                        began = time.monotonic()
                        call = {
                            "model": "m",
                            "messages": [{"role": "user", "content": "x"}],
                            "sim": {"latency_ms": LATENCY_MS, "key": f"w{w}-{i}"},
                        }
                        try:
                            await producer.submit(call, pool_id="default", timeout=REQUEST_TIMEOUT_S)
                        except DispatchError as exc:
                            outcomes[type(exc).__name__] += 1
                            await asyncio.sleep(0.05)  # a caller backing off while Valkey fails over
                            continue
                        now = time.monotonic()
                        done.append(now)
                        if began > killed_at[0]:
                            started_after.append(now)

                workers = [asyncio.create_task(worker(w)) for w in range(WORKERS)]
                await asyncio.sleep(WARMUP_S)  # the load before the kill is part of the measurement
                cluster.kill_primary()
                killed_at[0] = time.monotonic()
                await asyncio.sleep(AFTER_S)  # and the load after it
                stop.set()
                await asyncio.gather(*workers)
                duplicates = producer.stats.duplicate_replies
        counters = await conn.hgetall(keys.counters(config.group_id))
        counted = {
            reason: int(counters.get(f"dropped:{reason}".encode(), 0))
            for reason in ("reply_undelivered", "lost_in_flight")
        }
    kill = killed_at[0]
    return Run(
        completions=[t - kill for t in done],
        first_after_kill_s=(min(started_after) - kill) if started_after else float("inf"),
        acknowledged_lost=outcomes["RequestTimeout"],
        counted_lost=counted,
        refused=outcomes["QueueUnavailable"],
        duplicates=duplicates,
    )


async def measure(quick: bool, runs: int) -> list[Run]:
    return [await one_run(DELIVERY) for _ in range(runs)]


def report(results: list[Run], runs: int, quick: bool) -> dict[str, float]:
    mode = f"{DELIVERY}, persist_replicas {PERSIST_REPLICAS}" if DELIVERY == DURABLE else DELIVERY
    print(
        f"# Valkey failover under load ({mode}): SIGKILL of the primary (2 replicas) behind 3 sentinels "
        f"(down-after {DOWN_AFTER_MS} ms), {WORKERS} closed-loop workers, "
        f"one dispatcher (lease {LEASE_S:g} s), "
        f"backend latency {LATENCY_MS} ms, {runs} run(s){' (quick)' if quick else ''}"
    )
    print(f"# {machine()}")
    for n, run in enumerate(results, 1):
        per_second = collections.Counter(int(t // 1) for t in run.completions)
        seconds = range(-int(WARMUP_S), int(AFTER_S))
        print(f"run {n}: completions/s from {seconds[0]} s to {seconds[-1]} s around the kill:")
        print("  " + " ".join(f"{s:+d}:{per_second.get(s, 0)}" for s in seconds))
        print(
            f"  first completion submitted after the kill: {run.first_after_kill_s:.2f} s; "
            f"acknowledged lost: {run.acknowledged_lost} "
            f"(the dispatcher counted {run.counted_lost}); refused (not acknowledged): {run.refused}; "
            f"duplicate replies: {run.duplicates}"
        )
    first = median([r.first_after_kill_s for r in results])
    lost = sum(r.acknowledged_lost for r in results)
    print(
        "target: first completion on the new primary <= 5 s ->",
        "met" if first <= 5 else f"MISSED ({first:.2f})",
    )
    print(
        f"target: 0 acknowledged requests lost in {DELIVERY} mode ->",
        "met" if lost == 0 else f"MISSED ({lost})",
    )
    return {"first_after_kill_s": first, "acknowledged_lost": lost}


def main(argv: list[str] | None = None) -> dict[str, float]:
    global DELIVERY, PERSIST_REPLICAS
    args = list(sys.argv[1:] if argv is None else argv)
    if "--delivery" in args:
        at = args.index("--delivery")
        DELIVERY = {"durable": DURABLE, "lists": LISTS}[args[at + 1]]
        del args[at : at + 2]
    if "--persist-replicas" in args:
        at = args.index("--persist-replicas")
        PERSIST_REPLICAS = int(args[at + 1])
        del args[at : at + 2]
    return run_benchmark(__doc__ or "", measure, report, args, default_runs=1)  # type: ignore[no-any-return]


if __name__ == "__main__":
    main()
