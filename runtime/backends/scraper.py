"""One scraper per backend across the fleet: read its ``/metrics`` every ~250 ms, share the load.

Every dispatcher runs a :class:`BackendScraper` for the backends of its group, but only the holder of
a backend's lease (``SET NX PX`` on :meth:`~runtime.wire.keys.KeySpace.backend_scrape_lease`,
renewed by each scrape) fetches it; the others only try to take the lease, so a backend is scraped
once per interval however many dispatchers and groups use it, and a killed scraper is replaced
within one lease. The result is shared as a :class:`~runtime.backends.metrics.BackendLoad` under
:meth:`~runtime.wire.keys.KeySpace.backend_load`, which the dispatchers' gate reads.

The fleet's in-flight count to the backend is read *before* the metrics are fetched: a call
launched in between is then counted twice (in the backend's queue and as launched since the
scrape), never zero times, so the gate errs on the side of holding work in our queue.

A failed scrape is shared too (``error`` set), so every dispatcher falls back to ``max_in_flight``
at once and the dashboard says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import httpx
import redis.asyncio as aioredis

from runtime.backends.metrics import BackendLoad, parse_load
from runtime.backends.redact import redact_url
from runtime.valkey.client import REDIS_ERRORS
from runtime.wire.backendconfig import BackendConfig
from runtime.wire.keys import BACKEND_LOAD_TTL_S, SCRAPE_LEASE_MS, KeySpace

log = logging.getLogger(__name__)
SCRAPE_INTERVAL_S = 0.25

__all__ = ["SCRAPE_INTERVAL_S", "BackendScraper", "ScraperStats"]

# KEYS: lease key; ARGV: owner id, lease ms. 1 when the caller holds the lease (taken or renewed).
LEASE = """
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if owner then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS: lease key; ARGV: owner id. Gives the lease up only if still ours (a stopping scraper).
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(slots=True)
class ScraperStats:
    scrapes: int = 0
    failures: int = 0
    leases_held: set[str] = field(default_factory=set)


class BackendScraper:
    """Scrapes, for the fleet, the backends whose lease this process holds."""

    def __init__(
        self,
        client: aioredis.Redis,
        keys: KeySpace,
        *,
        owner_id: str,
        interval_s: float = SCRAPE_INTERVAL_S,
        lease_ms: int = SCRAPE_LEASE_MS,
        http: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.keys = keys
        self.owner_id = owner_id
        self.interval_s = interval_s
        self.lease_ms = lease_ms
        self.clock = clock
        self.stats = ScraperStats()
        self._http = http or httpx.AsyncClient(timeout=httpx.Timeout(max(0.5, 2 * interval_s)))
        self._lease = client.register_script(LEASE)
        self._release = client.register_script(RELEASE)
        self._backends: dict[str, BackendConfig] = {}

    def __repr__(self) -> str:
        return (
            f"<BackendScraper {self.owner_id} backends={sorted(self._backends)} "
            f"scraping={sorted(self.stats.leases_held)} scrapes={self.stats.scrapes}>"
        )

    def configure(self, backends: Iterable[BackendConfig]) -> None:
        """The backends to scrape: those with load gating on and a kind that exports load metrics."""
        self._backends = {b.backend_id: b for b in backends if b.scrapes}

    async def run(self, finished: asyncio.Event, *, on_error: Callable[[BaseException], None]) -> None:
        """Scrapes every interval until ``finished`` is set; Valkey errors are reported and waited out."""
        try:
            while not finished.is_set():
                started = time.monotonic()
                try:
                    await self.scrape_once()
                except REDIS_ERRORS as exc:
                    on_error(exc)
                delay = max(0.0, self.interval_s - (time.monotonic() - started))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(finished.wait(), delay)
        finally:
            await self.close()

    async def scrape_once(self) -> list[str]:
        """One pass: take or renew each backend's lease, scrape the ones held; returns their ids."""
        held = []
        for backend_id in sorted(self._backends):
            if int(await self._lease(keys=[self.keys.backend_scrape_lease(backend_id)],
                                     args=[self.owner_id, self.lease_ms])):  # fmt: skip
                held.append(backend_id)
        self.stats.leases_held = set(held)
        if held:
            await asyncio.gather(*(self._scrape(self._backends[b]) for b in held))
        return held

    async def _scrape(self, backend: BackendConfig) -> None:
        in_flight = int(await self.client.zcount(self.keys.backend_inflight(backend.backend_id),
                                                 f"({self.clock()}", "+inf"))  # fmt: skip
        started = time.perf_counter()
        scraped_at = self.clock()
        url = backend.scrape_url()
        try:
            # A scrape may take as long as its result stays fresh: later, it would be stale anyway.
            response = await self._http.get(url, timeout=max(self.interval_s, backend.metrics_max_age_s))
            response.raise_for_status()
            load = parse_load(
                response.text, kind=backend.kind, backend_id=backend.backend_id, scraped_at=scraped_at
            )
        except (httpx.HTTPError, ValueError) as exc:
            self.stats.failures += 1
            error = f"{type(exc).__name__}: {exc}"[:200].replace(url, redact_url(url))
            if self.stats.failures == 1 or self.stats.failures % 100 == 0:
                log.warning("backend %s metrics unreachable (%s)", backend.backend_id, error)
            load = BackendLoad(backend.backend_id, scraped_at, error=error or type(exc).__name__)
        self.stats.scrapes += 1
        load = BackendLoad(
            backend_id=load.backend_id,
            scraped_at=load.scraped_at,
            running=load.running,
            waiting=load.waiting,
            kv_usage=load.kv_usage,
            in_flight_at_scrape=in_flight,
            error=load.error,
            scrape_ms=round(1000 * (time.perf_counter() - started), 3),
        )
        await self.client.set(self.keys.backend_load(backend.backend_id), load.encode(),
                              px=int(BACKEND_LOAD_TTL_S * 1000))  # fmt: skip

    async def close(self) -> None:
        """Gives up the leases held (the next scraper takes over at once) and closes the HTTP client."""
        for backend_id in sorted(self.stats.leases_held):
            with contextlib.suppress(*REDIS_ERRORS):
                await self._release(keys=[self.keys.backend_scrape_lease(backend_id)], args=[self.owner_id])
        self.stats.leases_held = set()
        await self._http.aclose()
