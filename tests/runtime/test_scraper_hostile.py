"""Issue 19, section 1: a backend's ``/metrics`` is untrusted input.

Small real aiohttp servers answer ``/metrics`` as a broken or hostile backend would (``+Inf``,
``NaN``, a 10 MB body, a body dripped a byte every 0.3 s); the scraper reads them over real HTTP and
shares the result through a real Valkey, and the gate, the status words and a real dispatcher read it.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from runtime.backends import scraper as scraper_module
from runtime.backends.breaker import BreakerState
from runtime.backends.gate import METRICS_FRESH, METRICS_REFUSED, METRICS_UNREACHABLE, gate
from runtime.backends.metrics import BackendLoad
from runtime.backends.scraper import BackendScraper
from runtime.backends.status import status_from_replies
from runtime.producer import Producer
from runtime.queue import groups
from runtime.queue.keys import KeySpace
from runtime.wire.backendconfig import BackendConfig
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatcher_process import start_dispatcher, stop_dispatcher
from tests.support.dispatching import CALL, running_dispatcher
from tests.support.hostile_metrics import (
    MetricsServer,
    ThreadedMetricsServer,
    body,
    drip,
    streamed,
    vllm_text,
)
from tests.support.waiting import wait_until


async def shared(client: aioredis.Redis, keys: KeySpace, backend_id: str) -> BackendLoad:
    raw = await client.get(keys.backend_load(backend_id))
    assert raw, f"no shared load for {backend_id}"
    return BackendLoad.decode(raw)


async def status_words(client: aioredis.Redis, keys: KeySpace, backend: BackendConfig) -> str:
    now = time.time()
    replies = [await client.get(keys.backend_load(backend.backend_id)), None, 0, -2]
    return status_from_replies(backend, replies, now).describe()


@pytest.fixture
async def scraper(aredis: aioredis.Redis, keys: KeySpace) -> AsyncIterator[BackendScraper]:
    scraper = BackendScraper(aredis, keys, owner_id="d1")
    yield scraper
    await scraper.close()


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ({"running": "+Inf"}, "vllm:num_requests_running is inf (not a finite number)"),
        ({"waiting": "-Inf"}, "vllm:num_requests_waiting is -inf (not a finite number)"),
        ({"kv": "NaN"}, "vllm:kv_cache_usage_perc is nan (not a finite number)"),
        ({"waiting": "-3"}, "vllm:num_requests_waiting is -3 (negative)"),
        ({"running": "1e12"}, "vllm:num_requests_running adds up to 1e+12 requests (absurd"),
        ({"kv": "42"}, "vllm:kv_cache_usage_perc is 42, but a KV-cache usage is a fraction"),
    ],
)
async def test_bad_values_are_refused_with_the_reason(
    aredis: aioredis.Redis, keys: KeySpace, scraper: BackendScraper, values: dict[str, str], why: str
) -> None:
    """Before: +Inf raised OverflowError out of the scraper, NaN was shared as null and made the
    gate raise TypeError; negative and absurd values were used as they came."""
    async with MetricsServer(body(vllm_text(**values))) as server:
        backend = BackendConfig("b", "http://127.0.0.1:9/v1", metrics_url=server.url, max_in_flight=5)
        scraper.configure([backend])
        assert await scraper.scrape_once() == ["b"]
    load = await shared(aredis, keys, "b")
    assert load.refused and why in load.error
    decision = gate(backend.gate_settings(), load, in_flight=4, now=time.time())
    assert (decision.limit, decision.reason, decision.metrics) == (5, None, METRICS_REFUSED)
    words = await status_words(aredis, keys, backend)
    assert f"metrics refused: {why}" in words and "max in flight only" in words


async def test_an_old_vllm_is_read_by_its_old_gauge_name_and_says_so(
    aredis: aioredis.Redis, keys: KeySpace, scraper: BackendScraper
) -> None:
    """vLLM before 0.10 names the KV-cache usage vllm:gpu_cache_usage_perc. Before: refused as lacking
    vllm:kv_cache_usage_perc, so gating such a server fell back to max in flight alone."""
    text = vllm_text(running="2", waiting="1", kv="0.93", kv_name="gpu_cache_usage_perc")
    async with MetricsServer(body(text)) as server:
        backend = BackendConfig("old", "http://127.0.0.1:9/v1", metrics_url=server.url, max_in_flight=5)
        scraper.configure([backend])
        await scraper.scrape_once()
    load = await shared(aredis, keys, "old")
    assert (load.ok, load.kv_usage, load.kv_metric) == (True, 0.93, "vllm:gpu_cache_usage_perc")
    decision = gate(backend.gate_settings(), load, in_flight=0, now=time.time())
    assert (decision.limit, decision.metrics) == (0, METRICS_FRESH)  # KV over 0.8: nothing new
    words = await status_words(aredis, keys, backend)
    assert "KV-cache usage read from vllm:gpu_cache_usage_perc (older server)" in words


class LoopWatch:
    """The longest stretch of CPU the event loop's thread spent between two of its ticks: CPU time,
    so a busy machine (other processes) does not count, only work done on this loop.

    The cyclic collector is paused while it watches: a full collection walks the whole test process's
    heap (a thousand tests' worth in a CI worker), a pause that says nothing of the code watched. The
    server a test scrapes runs on a thread of its own (``ThreadedMetricsServer``) for the same reason.
    """

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None
        self._collecting = False

    async def _tick(self) -> None:
        last = time.thread_time()
        while True:
            await asyncio.sleep(0.002)  # not a wait: the watch's tick, whose gaps it measures
            now = time.thread_time()
            self.longest = max(self.longest, now - last)
            last = now

    def __enter__(self) -> LoopWatch:
        self._collecting = gc.isenabled()
        gc.disable()
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        if self._collecting:
            gc.enable()


@pytest.mark.parametrize(
    ("handler", "why"),
    [
        # Announced by its content length: refused before a byte of the body is read.
        (body(b"vllm:num_requests_running 1\n" * 400_000), "bytes, over the cap (1048576 bytes)"),
        # Chunked, no length: refused once the cap is passed while reading.
        (streamed(10_000_000), "the metrics body is over the cap (1048576 bytes)"),
    ],
    ids=["content-length", "chunked"],
)
async def test_a_huge_body_is_refused_at_the_cap_and_never_stalls_the_loop(
    aredis: aioredis.Redis, keys: KeySpace, scraper: BackendScraper, handler: Callable[..., object], why: str
) -> None:
    """Before: a 10 MB body was read whole and parsed on the loop (seconds of CPU in one callback)."""
    with ThreadedMetricsServer(handler) as server:  # type: ignore[arg-type]
        backend = BackendConfig("big", "http://127.0.0.1:9/v1", metrics_url=server.url)
        scraper.configure([backend])
        with LoopWatch() as watch:
            await scraper.scrape_once()
    load = await shared(aredis, keys, "big")
    assert load.refused and why in load.error
    assert watch.longest < 0.05, f"the loop was held for {watch.longest:.3f}s of CPU"


async def test_a_body_just_under_the_cap_is_parsed_without_stalling_the_loop(
    aredis: aioredis.Redis, keys: KeySpace, scraper: BackendScraper
) -> None:
    filler = "".join(f'other_metric{{i="{i}"}} {i}\n' for i in range(30_000))  # ~0.9 MB to skip
    with ThreadedMetricsServer(body(filler + vllm_text(running="3"))) as server:
        backend = BackendConfig("wide", "http://127.0.0.1:9/v1", metrics_url=server.url)
        scraper.configure([backend])
        with LoopWatch() as watch:
            await scraper.scrape_once()
    load = await shared(aredis, keys, "wide")
    assert (load.ok, load.running) == (True, 3), load.error
    assert watch.longest < 0.05, f"the loop was held for {watch.longest:.3f}s of CPU"


async def test_a_dripping_backend_times_out_and_the_others_stay_fresh(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    """Before: the timeout was per read (0.5 s) and a byte came every 0.3 s, so the scrape never ended;
    every pass waited for all backends, so the healthy one's load went stale and gating switched off."""
    scraper = BackendScraper(aredis, keys, owner_id="d1")
    async with MetricsServer(drip(0.3)) as slow, SimulatorServer(SimulatorConfig()) as sim:
        dripping = BackendConfig("drip", "http://127.0.0.1:9/v1", metrics_url=slow.url, metrics_timeout_s=1.0)
        healthy = BackendConfig("sim", sim.url, max_in_flight=8)
        scraper.configure([dripping, healthy])
        finished = asyncio.Event()
        task = asyncio.create_task(scraper.run(finished, on_error=lambda exc: None))
        try:
            load = await wait_until(
                lambda: _error_of(aredis, keys, "drip"), timeout=10, what="the dripping scrape to end"
            )
            assert "no whole answer within 1s (metrics timeout)" in load.error and not load.refused
            # Meanwhile the healthy backend was scraped pass after pass, not once per dripping scrape.
            during = sim.requests_by_path.get("/metrics", 0)
            assert during >= 3, f"the healthy backend was scraped {during} times while the other dripped"
            fresh = await shared(aredis, keys, "sim")
            decision = gate(healthy.gate_settings(), fresh, in_flight=0, now=time.time())
            assert decision.metrics == METRICS_FRESH
        finally:
            finished.set()
            await task
    assert gate(dripping.gate_settings(), load, in_flight=0, now=time.time()).metrics == METRICS_UNREACHABLE


async def _error_of(client: aioredis.Redis, keys: KeySpace, backend_id: str) -> BackendLoad | None:
    raw = await client.get(keys.backend_load(backend_id))
    load = BackendLoad.decode(raw) if raw else None
    return load if load is not None and not load.ok else None


def gated_group(sim_url: str, metrics_url: str) -> GroupConfig:
    backend = BackendConfig("b", sim_url, metrics_url=metrics_url, max_in_flight=4)
    return GroupConfig(
        group_id="g",
        policy="fifo",
        total_concurrency=4,
        pools=(PoolConfig(pool_id="default", max_concurrent=4),),
        version=1,
        backend_id="b",
        backends=(backend,),
    )


async def test_a_failing_scraper_is_counted_and_never_ends_the_dispatcher(
    aredis: aioredis.Redis, keys: KeySpace, sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any unforeseen failure inside a scrape (a bug) is logged and counted as an internal error and
    scraping goes on. Before: anything but an HTTP or value error left the scraper's task, and the
    dispatcher's task group ended the dispatcher."""
    real = scraper_module.load_from_lines
    failures = {"left": 3}

    def flaky(*args: object, **kwargs: object) -> BackendLoad:
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("a bug in parsing")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(scraper_module, "load_from_lines", flaky)
    async with (
        MetricsServer(body(vllm_text())) as server,
        running_dispatcher(aredis, keys, gated_group(sim.url, server.url)) as dispatcher,
    ):
        await wait_until(lambda: server.scrapes >= 5, what="scrapes after the failures")
        assert dispatcher.fleet.scraper.stats.crashes == 3
        assert dispatcher.stats.internal_errors == 3
        async with Producer(aredis, keys=keys) as producer:
            result = await producer.submit(CALL, pool_id="default", timeout=20)
        assert result.completion["choices"]
        load = await shared(aredis, keys, "b")
        assert load.ok and load.running == 1


async def test_a_load_shared_with_null_values_never_stops_dispatching(
    aredis: aioredis.Redis, keys: KeySpace, sim: SimulatorServer
) -> None:
    """A NaN used to be shared as null; the gate then raised TypeError at the start of every round,
    so nothing dispatched. Now the NaN is refused at the scrape, and any shape of shared load (as an
    older dispatcher may still write it) is refused by the gate, never computed with."""
    async with (
        MetricsServer(body(vllm_text(kv="NaN"))) as server,
        running_dispatcher(aredis, keys, gated_group(sim.url, server.url)) as dispatcher,
    ):
        await wait_until(lambda: server.scrapes >= 1, what="a scrape")
        async with Producer(aredis, keys=keys) as producer:
            results = await asyncio.gather(
                *(producer.submit(CALL, pool_id="default", timeout=20) for _ in range(6))
            )
        assert all(r.completion["choices"] for r in results)
        assert dispatcher.stats.internal_errors == 0
    status = status_from_replies(gated_group(sim.url, "").backends[0], [
        b'{"backend_id":"b","scraped_at":1.0,"kv_usage":null}', None, 0, -2], time.time())  # fmt: skip
    assert status.metrics == METRICS_REFUSED and "kv_usage is None, not a fraction" in status.scrape_error
    assert status.kv_usage is None and BreakerState().mode == status.breaker


@pytest.mark.slow
async def test_infinite_metrics_never_end_a_dispatcher_process(
    aredis: aioredis.Redis, keys: KeySpace, valkey_url: str, sim: SimulatorServer
) -> None:
    """Before: +Inf raised OverflowError in the scraper's task, the dispatcher's task group ended and
    rundispatcher exited; the next dispatcher took the scrape lease and died the same way."""
    async with MetricsServer(body(vllm_text(running="+Inf"))) as server:
        await groups.publish(aredis, keys, gated_group(sim.url, server.url))
        procs = {
            f"d{i}": start_dispatcher(valkey_url, keys.prefix, "g", f"d{i}", concurrency=4) for i in range(2)
        }
        try:
            await wait_until(lambda: server.scrapes >= 8, timeout=30, what="eight scrapes")
            assert {d: p.poll() for d, p in procs.items()} == {"d0": None, "d1": None}
            load = await shared(aredis, keys, "b")
            assert load.refused and "vllm:num_requests_running is inf" in load.error
            # The lease holder really dies: the other takes the lease over and lives on too.
            holder = (await aredis.get(keys.backend_scrape_lease("b"))).decode()
            procs[holder].kill()
            procs[holder].wait(10)
            seen = server.scrapes
            await wait_until(lambda: server.scrapes >= seen + 8, timeout=30, what="the heir's scrapes")
            [heir] = [p for d, p in procs.items() if d != holder]
            assert heir.poll() is None
            async with Producer(aredis, keys=keys) as producer:
                result = await producer.submit(CALL, pool_id="default", timeout=20)
            assert result.completion["choices"]  # gating fell back to max in flight, and said why
        finally:
            for proc in procs.values():
                stop_dispatcher(proc)
