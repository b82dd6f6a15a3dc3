"""The fleet's backend scraper against the real simulator over HTTP and a real Valkey lease."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import redis.asyncio as aioredis

from runtime.backends.gate import METRICS_FRESH, METRICS_UNREACHABLE, SKIP_BACKEND_SATURATED, gate
from runtime.backends.metrics import BackendLoad
from runtime.backends.scraper import BackendScraper
from runtime.queue.keys import KeySpace
from runtime.valkey import embedded
from runtime.wire.backendconfig import BackendConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.waiting import wait_until


async def shared_load(client: aioredis.Redis, keys: KeySpace, backend_id: str) -> BackendLoad | None:
    raw = await client.get(keys.backend_load(backend_id))
    return BackendLoad.decode(raw) if raw else None


def metrics_requests(sim: SimulatorServer) -> int:
    return sim.requests_by_path.get("/metrics", 0)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_scrape_shares_the_true_load(aredis: aioredis.Redis, keys: KeySpace, kind: str) -> None:
    config = SimulatorConfig(kind=kind, max_running=2, latency_ms=30_000, kv_cache_tokens=1000)
    async with SimulatorServer(config) as sim, httpx.AsyncClient(timeout=60) as http:
        backend = BackendConfig("sim", sim.url, kind=kind, max_in_flight=8)
        calls = [
            asyncio.create_task(http.post(f"{sim.url}/chat/completions", json={"model": "m", "messages": [
                {"role": "user", "content": "hi"}]})) for _ in range(5)
        ]  # fmt: skip
        now = time.time()
        await aredis.zadd(
            keys.backend_inflight("sim"), {f"p:r{i}": now + 30 for i in range(5)} | {"p:old": now - 1}
        )
        scraper = BackendScraper(aredis, keys, owner_id="d1")
        scraper.configure([backend])
        try:
            await wait_until(lambda: sim.waiting == 3, what="three calls waiting in the simulator")
            assert await scraper.scrape_once() == ["sim"]
        finally:
            await scraper.close()
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
        load = await shared_load(aredis, keys, "sim")
        assert load is not None and load.ok
        assert (load.running, load.waiting, load.in_flight_at_scrape) == (2, 3, 5)
        assert 0 < load.kv_usage < 1 and load.scraped_at >= now
        # Three waiting, threshold five: two more calls may go, then the backend counts as saturated.
        decision = gate(backend.gate_settings(), load, in_flight=7, now=time.time())
        assert (decision.limit, decision.reason, decision.metrics) == (
            7,
            SKIP_BACKEND_SATURATED,
            METRICS_FRESH,
        )


async def test_one_scraper_per_backend_and_a_stopped_one_is_replaced(valkey_url: str, keys: KeySpace) -> None:
    clients = [aioredis.Redis.from_url(valkey_url) for _ in range(2)]
    async with SimulatorServer(SimulatorConfig()) as sim:
        backend = BackendConfig("sim", sim.url, max_in_flight=4)
        scrapers = [BackendScraper(c, keys, owner_id=f"d{i}", interval_s=0.05) for i, c in enumerate(clients)]
        for scraper in scrapers:
            scraper.configure([backend])
        finished = [asyncio.Event(), asyncio.Event()]
        tasks = [
            asyncio.create_task(s.run(f, on_error=lambda e: None))
            for s, f in zip(scrapers, finished, strict=True)
        ]
        try:
            await wait_until(lambda: metrics_requests(sim) >= 20, what="twenty scrapes")
            holders = [s for s in scrapers if s.stats.leases_held]
            assert len(holders) == 1 and holders[0].stats.scrapes >= 19
            other = scrapers[1 - scrapers.index(holders[0])]
            assert other.stats.scrapes == 0
            # The holder stops (gives its lease up): the other takes over at once.
            finished[scrapers.index(holders[0])].set()
            await wait_until(lambda: other.stats.scrapes >= 5, what="the other scraper taking over")
        finally:
            for event in finished:
                event.set()
            await asyncio.gather(*tasks)
            for c in clients:
                await c.aclose()
        # Every scrape came from one scraper at a time: about one per interval, not two.
        assert metrics_requests(sim) == scrapers[0].stats.scrapes + scrapers[1].stats.scrapes


async def test_a_killed_scrapers_lease_lapses(aredis: aioredis.Redis, keys: KeySpace) -> None:
    async with SimulatorServer(SimulatorConfig()) as sim:
        backend = BackendConfig("sim", sim.url, max_in_flight=4)
        gone = BackendScraper(aredis, keys, owner_id="gone", lease_ms=300)
        heir = BackendScraper(aredis, keys, owner_id="heir", lease_ms=300)
        for scraper in (gone, heir):
            scraper.configure([backend])
        assert await gone.scrape_once() == ["sim"]
        assert await heir.scrape_once() == []
        # "gone" never scrapes again nor releases (as if killed): its lease lapses within 300 ms.
        started = time.monotonic()
        await wait_until(heir.scrape_once, timeout=5, interval=0.02, what="the lease lapsed for the heir")
        assert time.monotonic() - started < 2.0
        await heir.close()


async def test_unreachable_metrics_are_shared_and_fall_back(aredis: aioredis.Redis, keys: KeySpace) -> None:
    backend = BackendConfig("dead", f"http://127.0.0.1:{embedded.free_port()}/v1", max_in_flight=3)
    scraper = BackendScraper(aredis, keys, owner_id="d1")
    scraper.configure(
        [backend, BackendConfig("plain", "http://127.0.0.1:9/v1", kind="openai", load_gating=False)]
    )
    try:
        assert await scraper.scrape_once() == ["dead"]  # an openai-kind backend is never scraped
    finally:
        await scraper.close()
    load = await shared_load(aredis, keys, "dead")
    assert load is not None and "ConnectError" in load.error
    decision = gate(backend.gate_settings(), load, in_flight=2, now=time.time())
    assert (decision.limit, decision.reason, decision.metrics) == (3, None, METRICS_UNREACHABLE)
