"""Backends gating real dispatcher processes against the real simulator over HTTP.

The simulator runs in this test's process (so its engine can be sampled at any instant), in this
test's event loop or, where its /metrics drives the test, on a loop of its own; the dispatchers are
separate processes; producers push through Valkey.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
import redis.asyncio as aioredis

from runtime.backends.breaker import decode_state
from runtime.backends.status import BackendStatus, queue_reads, status_from_replies
from runtime.errors import DispatchError
from runtime.producer import Producer
from runtime.queue import groups
from runtime.queue.keys import KeySpace
from runtime.valkey import embedded
from runtime.wire.backendconfig import BackendConfig
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatcher_process import start_dispatcher, start_dispatchers, stop
from tests.support.dispatching import CALL, running_dispatcher
from tests.support.loop_thread import simulator_thread
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def two_pools(backend: BackendConfig, *, total: int = 32) -> GroupConfig:
    return GroupConfig(
        group_id="g",
        total_concurrency=total,
        pools=(
            PoolConfig("interactive", quantum=4, max_concurrent=total, max_burst_per_visit=4),
            PoolConfig("backfill", quantum=1, max_concurrent=total),
        ),
        version=1,
        backend_id=backend.backend_id,
        backends=(backend,),
    )


async def sample(
    sim: SimulatorServer, stop_when: asyncio.Event, every_s: float = 0.01
) -> list[tuple[float, int, int]]:
    """(time, running, waiting) of the simulator's engine until ``stop_when`` is set."""
    seen = []
    while not stop_when.is_set():
        seen.append((time.monotonic(), sim.running, sim.waiting))
        await asyncio.sleep(every_s)  # not a wait: the sampling interval of the monitor
    return seen


async def flood(producer: Producer, pool_id: str, n: int) -> list[object]:
    return await asyncio.gather(
        *(producer.submit(CALL, pool_id=pool_id, timeout=120) for _ in range(n)), return_exceptions=True
    )


async def test_gating_keeps_the_backends_queue_at_its_threshold(
    aredis: aioredis.Redis, keys: KeySpace, valkey_url: str
) -> None:
    """max-running 4, group total 32: ungated, 28 calls would wait in the simulator's FIFO."""
    # The simulator on a loop of its own: in this test's loop, its /metrics waited behind the flood's
    # 160 submits and their replies, so on a loaded machine a scrape overran its 1 s budget, and the
    # fleet (rightly) fell back to max_in_flight alone: 16 calls waited in the backend's queue.
    with simulator_thread(SimulatorConfig(max_running=4, latency_ms=60)) as sim:
        backend = BackendConfig("sim", sim.url, max_in_flight=32, max_waiting=3)
        await groups.publish(aredis, keys, two_pools(backend))
        procs = [start_dispatcher(valkey_url, keys.prefix, "g", f"d{i}", concurrency=32) for i in range(2)]
        done = asyncio.Event()
        watcher = asyncio.create_task(sample(sim, done))
        try:
            async with Producer(aredis, keys=keys) as producer:
                results = await flood(producer, "backfill", 160)
        finally:
            done.set()
            stop(procs)
        seen = await watcher
    assert all(isinstance(r, dict) or hasattr(r, "completion") for r in results), results[:3]
    # Over the threshold (3) for at most about one scrape interval (250 ms) at a time; the peak stays
    # far below what 32 slots would push there (28).
    longest, since = 0.0, None
    for at, _, waiting in seen:
        if waiting > 3:
            since = at if since is None else since
            longest = max(longest, at - since)
        else:
            since = None
    # (Generous: on a loaded machine a scrape can come late, and calls done at the backend but not
    # yet finished by their dispatcher count as ours in flight until the next scrape.)
    assert longest <= 0.25 + 0.75, f"waiting stayed over the threshold for {longest:.2f}s"
    assert max(w for _, _, w in seen) <= 8
    assert max(r for _, r, _ in seen) == 4  # and the backend was kept busy


async def test_max_in_flight_holds_across_two_dispatchers_and_two_pools(
    aredis: aioredis.Redis, keys: KeySpace, valkey_url: str
) -> None:
    async with SimulatorServer(SimulatorConfig(latency_ms=40)) as sim:
        backend = BackendConfig("sim", sim.url, kind="openai", load_gating=False, max_in_flight=3)
        await groups.publish(aredis, keys, two_pools(backend, total=16))
        procs = [start_dispatcher(valkey_url, keys.prefix, "g", f"d{i}", concurrency=16) for i in range(2)]
        done = asyncio.Event()
        watcher = asyncio.create_task(sample(sim, done, every_s=0.005))
        try:
            async with Producer(aredis, keys=keys) as producer:
                results = await asyncio.gather(
                    flood(producer, "interactive", 40), flood(producer, "backfill", 40)
                )
        finally:
            done.set()
            stop(procs)
        seen = await watcher
    assert sum(1 for rs in results for r in rs if hasattr(r, "completion")) == 80
    assert max(r + w for _, r, w in seen) == 3


async def test_unreachable_metrics_fall_back_to_max_in_flight(
    aredis: aioredis.Redis, keys: KeySpace, valkey_url: str
) -> None:
    async with SimulatorServer(SimulatorConfig(max_running=8, latency_ms=30)) as sim:
        dead = f"http://127.0.0.1:{embedded.free_port()}/metrics"
        backend = BackendConfig("sim", sim.url, max_in_flight=2, metrics_url=dead)
        await groups.publish(aredis, keys, two_pools(backend, total=16))
        procs = [start_dispatcher(valkey_url, keys.prefix, "g", "d0", concurrency=16)]
        done = asyncio.Event()
        watcher = asyncio.create_task(sample(sim, done, every_s=0.005))
        try:
            async with Producer(aredis, keys=keys) as producer:
                results = await flood(producer, "backfill", 20)
                raw = await aredis.get(keys.backend_load("sim"))
        finally:
            done.set()
            stop(procs)
        seen = await watcher
    assert all(hasattr(r, "completion") for r in results)
    assert b"ConnectError" in raw  # shared, so the dashboard says why
    assert max(r + w for _, r, w in seen) == 2


async def test_breaker_is_shared_by_two_processes_and_survives_a_restart(
    aredis: aioredis.Redis, keys: KeySpace, valkey_url: str
) -> None:
    async with SimulatorServer(SimulatorConfig(latency_ms=5)) as sim:
        backend = BackendConfig("sim", sim.url, kind="openai", load_gating=False, breaker_failures=3,
                                breaker_open_s=30.0)  # fmt: skip
        config = two_pools(backend, total=8)
        await groups.publish(aredis, keys, config)
        procs = [start_dispatcher(valkey_url, keys.prefix, "g", f"d{i}", concurrency=1) for i in range(2)]
        failing = {**CALL, "sim": {"status": 503, "message": "overloaded"}}
        async with Producer(aredis, keys=keys) as producer:
            # Three failures, spread over both processes (one slot each), open the one breaker.
            fails = [producer.submit(failing, pool_id="backfill", timeout=30) for _ in range(3)]
            await asyncio.gather(*fails, return_exceptions=True)
            state = decode_state(await aredis.get(keys.backend_breaker("sim")))
            assert state.mode == "open" and state.trips == 1
            served = sim.requests_by_path.get("/v1/chat/completions", 0)
            stop(procs)
            # A fresh fleet finds it open: nothing reaches the backend, work waits in its queue.
            procs = await start_dispatchers(valkey_url, keys.prefix, "g", ["d9"], concurrency=4)
            waiting = asyncio.create_task(producer.submit(CALL, pool_id="interactive", timeout=30))
            await wait_until(lambda: aredis.llen(keys.requests("interactive")), what="the call queued")
            await wait_until(
                lambda: breaker_skip_reported(aredis, keys),
                interval=0.05,
                what="d9's snapshot reporting interactive held back by the open breaker",
            )
            assert sim.requests_by_path.get("/v1/chat/completions", 0) == served
            # The operator shortens the open time: the next round probes, the probe succeeds.
            await groups.publish(
                aredis, keys, replace(config, version=2, backends=(replace(backend, breaker_open_s=0.2),))
            )
            result = await waiting
            assert result.completion["choices"]
            stop(procs)
        state = decode_state(await aredis.get(keys.backend_breaker("sim")))
        assert state.mode == "closed" and state.trips == 1


async def breaker_skip_reported(client: aioredis.Redis, keys: KeySpace) -> bool:
    """Whether the dispatcher's snapshot reports interactive held back by the open breaker."""
    raw = await client.get(keys.snapshot("g", "d9"))
    return bool(raw and b"breaker_open" in raw)


async def test_a_429_retry_after_holds_the_pools_work_in_our_queue_across_the_fleet(
    aredis: aioredis.Redis, keys: KeySpace, valkey_url: str
) -> None:
    """Issue 24: a plain OpenAI-compatible backend (no metrics) answers 429 with Retry-After: 2. No
    dispatcher of the fleet sends it anything until the 2 s are over: the work waits in our queue, the
    snapshots and the backend's status say why, and it all runs once the time has passed."""
    async with SimulatorServer(SimulatorConfig(kind="openai")) as sim:
        backend = BackendConfig("sim", sim.url, kind="openai", load_gating=False, max_in_flight=8)
        await groups.publish(aredis, keys, two_pools(backend, total=8))
        procs = [start_dispatcher(valkey_url, keys.prefix, "g", f"d{i}", concurrency=4) for i in range(2)]
        try:
            async with Producer(aredis, keys=keys) as producer:
                limited = {**CALL, "sim": {"status": 429, "message": "slow down", "retry_after": 2}}
                with pytest.raises(DispatchError, match="slow down"):
                    await producer.submit(limited, pool_id="backfill", timeout=30)
                before_read = time.monotonic()
                pttl = await aredis.pttl(keys.backend_hold("sim"))
                assert 0 < pttl <= 2000
                hold_ends = before_read + pttl / 1000  # at the earliest
                served = sim.requests_by_path[CHAT]
                first_seen = asyncio.create_task(first_call_after(sim, served))
                pools = ("interactive", "backfill") * 3
                waiting = [asyncio.create_task(producer.submit(CALL, pool_id=p, timeout=30)) for p in pools]
                await wait_until(lambda: snapshots_say(aredis, keys, b"backend_retry_after"), what="the skip")
                status = await live_status(aredis, keys, backend)
                assert status.held == "backend_retry_after" and "Retry-After" in status.describe()
                results = await asyncio.gather(*waiting)
                seen_at = await first_seen
        finally:
            stop(procs)
    assert all(r.completion["choices"] for r in results)
    assert seen_at >= hold_ends, f"a call reached the backend {hold_ends - seen_at:.3f}s before Retry-After"


CHAT = "/v1/chat/completions"


async def first_call_after(sim: SimulatorServer, served: int) -> float:
    """When (monotonic) the simulator first receives a chat call beyond ``served``."""
    await wait_until(lambda: sim.requests_by_path[CHAT] > served, timeout=30, interval=0.005)
    return time.monotonic()


async def snapshots_say(client: aioredis.Redis, keys: KeySpace, word: bytes) -> bool:
    raws = [await client.get(keys.snapshot("g", f"d{i}")) for i in range(2)]
    return any(raw and word in raw for raw in raws)


async def live_status(client: aioredis.Redis, keys: KeySpace, backend: BackendConfig) -> BackendStatus:
    """The backend's status as the admin and the dashboard read it."""
    now = time.time()
    async with client.pipeline(transaction=False) as pipe:
        queue_reads(pipe, keys, backend.backend_id, now)
        replies = await pipe.execute()
    return status_from_replies(backend, replies, now)


async def test_a_hold_set_elsewhere_stops_the_next_claim_though_the_reading_says_room(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    """Issue 23: a round decides from the reading its last pipeline brought while that is young; the
    claim checks the hold itself, so a 429's Retry-After set by another dispatcher a moment ago is
    kept all the same. Here the reading is kept young whatever the time (a max age of a minute)."""
    async with SimulatorServer(SimulatorConfig(kind="openai")) as sim:
        backend = BackendConfig("sim", sim.url, kind="openai", load_gating=False, max_in_flight=8)
        config = replace(two_pools(backend, total=8), pools=(PoolConfig("backfill", max_concurrent=8),))
        async with (
            running_dispatcher(aredis, keys, config) as dispatcher,
            Producer(aredis, keys=keys) as producer,
        ):
            await producer.submit(CALL, pool_id="backfill", timeout=10)
            dispatcher.fleet.status_max_age_s = 60.0
            await aredis.set(keys.backend_hold("sim"), "0.5", px=500)  # another dispatcher's 429
            before_read = time.monotonic()
            hold_ends = before_read + await aredis.pttl(keys.backend_hold("sim")) / 1000  # at the earliest
            served = sim.requests_by_path[CHAT]
            first_seen = asyncio.create_task(first_call_after(sim, served))
            result = await producer.submit(CALL, pool_id="backfill", timeout=10)
            seen_at = await first_seen
            assert dispatcher.stats.skips[("backfill", "backend_retry_after")] >= 1
    assert result.completion["choices"]
    assert seen_at >= hold_ends, f"a call reached the backend {hold_ends - seen_at:.3f}s before it ended"
