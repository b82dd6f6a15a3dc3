"""One scraper per backend across the fleet: read its ``/metrics`` every ~250 ms, share the load.

Every dispatcher runs a :class:`BackendScraper` for the backends of its group, but only the holder of
a backend's lease (``SET NX PX`` on :meth:`~runtime.queue.keys.KeySpace.backend_scrape_lease`,
renewed by each scrape) fetches it; the others only try to take the lease, so a backend is scraped
once per interval however many dispatchers and groups use it, and a killed scraper is replaced
within one lease. The result is shared as a :class:`~runtime.backends.metrics.BackendLoad` under
:meth:`~runtime.queue.keys.KeySpace.backend_load`, which the dispatchers' gate reads.

The fleet's in-flight count to the backend is read *before* the metrics are fetched: a call
launched in between is then counted twice (in the backend's queue and as launched since the
scrape), never zero times, so the gate errs on the side of holding work in our queue.

A failed scrape is shared too (``error`` set), so every dispatcher falls back to ``max_in_flight``
at once and the dashboard says why.

A backend's ``/metrics`` is untrusted (issue 19): each backend is scraped in a task of its own, so a
slow one never delays the others' scrapes; a scrape has a total time budget (``metrics_timeout_s``,
connect to last byte, not per read) and a body-size cap (``metrics_max_bytes``); the body is filtered
chunk by chunk as it arrives (:class:`~runtime.backends.metrics.SampleLines`), and unusable values are
refused with the reason. A scrape that fails in an unforeseen way is logged and counted, and the
backend is scraped again on the next pass: nothing here ends the dispatcher that runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import httpx
import redis.asyncio as aioredis

from runtime.backends.metrics import BackendLoad, MetricsRefused, SampleLines, load_from_lines
from runtime.backends.redact import redact_url
from runtime.queue.keys import BACKEND_LOAD_TTL_S, SCRAPE_LEASE_MS, KeySpace
from runtime.queue.scripts import SCRAPE_LEASE, SCRAPE_RELEASE
from runtime.valkey.client import REDIS_ERRORS
from runtime.wire.backendconfig import BackendConfig

log = logging.getLogger(__name__)
SCRAPE_INTERVAL_S = 0.25
# A stopping scraper waits this long for its scrapes in progress (each is bounded by its own budget).
CLOSE_WAIT_S = 2.0

__all__ = ["SCRAPE_INTERVAL_S", "BackendScraper", "ScraperStats", "failure_words", "read_bounded"]


@dataclass(slots=True)
class ScraperStats:
    scrapes: int = 0
    failures: int = 0  # scrapes shared as unreachable or refused
    crashes: int = 0  # unforeseen exceptions caught (logged with their traceback); scraping goes on
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
        # Every request carries its backend's timeouts; the whole scrape is bounded by its budget.
        self._http = http or httpx.AsyncClient(follow_redirects=False)
        self._lease = client.register_script(SCRAPE_LEASE)
        self._release = client.register_script(SCRAPE_RELEASE)
        self._backends: dict[str, BackendConfig] = {}
        self._scrapes: dict[str, asyncio.Task[None]] = {}
        self._on_error: Callable[[BaseException], None] = lambda exc: None
        self._on_crash: Callable[[str], None] = _log_crash

    def __repr__(self) -> str:
        return (
            f"<BackendScraper {self.owner_id} backends={sorted(self._backends)} "
            f"scraping={sorted(self.stats.leases_held)} scrapes={self.stats.scrapes} "
            f"crashes={self.stats.crashes}>"
        )

    def configure(self, backends: Iterable[BackendConfig]) -> None:
        """The backends to scrape: those with load gating on and a kind that exports load metrics."""
        self._backends = {b.backend_id: b for b in backends if b.scrapes}

    async def run(
        self,
        finished: asyncio.Event,
        *,
        on_error: Callable[[BaseException], None],
        on_crash: Callable[[str], None] | None = None,
    ) -> None:
        """Scrapes every interval until ``finished`` is set. Valkey errors go to ``on_error`` and are
        waited out; anything unforeseen goes to ``on_crash`` (called while handling the exception, so
        it may log the traceback) and scraping goes on: it never ends the caller's task group."""
        self._on_error = on_error
        if on_crash is not None:
            self._on_crash = on_crash
        try:
            while not finished.is_set():
                started = time.monotonic()
                try:
                    await self.tick()
                except REDIS_ERRORS as exc:
                    on_error(exc)
                except Exception:
                    self._crashed("the backend scraper's pass failed; it carries on")
                delay = max(0.0, self.interval_s - (time.monotonic() - started))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(finished.wait(), delay)
        finally:
            await self.close()

    async def tick(self) -> list[str]:
        """Takes or renews each backend's lease and starts a scrape of each backend held whose last
        scrape is over (a slow backend skips passes; the others do not wait for it). Returns the ids
        held; never waits for a scrape."""
        held = []
        for backend_id in sorted(self._backends):
            if int(await self._lease(keys=[self.keys.backend_scrape_lease(backend_id)],
                                     args=[self.owner_id, self.lease_ms])):  # fmt: skip
                held.append(backend_id)
        self.stats.leases_held = set(held)
        self._scrapes = {b: t for b, t in self._scrapes.items() if not t.done()}
        for backend_id in held:
            if backend_id not in self._scrapes:
                backend = self._backends[backend_id]
                self._scrapes[backend_id] = asyncio.create_task(self._scrape_guarded(backend))
        return held

    async def scrape_once(self) -> list[str]:
        """One pass that also waits for the scrapes of the backends held; returns their ids."""
        held = await self.tick()
        await asyncio.gather(*(self._scrapes[b] for b in held if b in self._scrapes))
        return held

    def _crashed(self, what: str) -> None:
        self.stats.crashes += 1
        self._on_crash(what)

    async def _scrape_guarded(self, backend: BackendConfig) -> None:
        """One scrape as a task of its own: it reports its failures and never raises."""
        try:
            await self._scrape(backend)
        except REDIS_ERRORS as exc:
            self._on_error(exc)
        except Exception:
            self._crashed(f"scraping backend {backend.backend_id} failed; it is scraped again next pass")

    async def _scrape(self, backend: BackendConfig) -> None:
        in_flight = int(await self.client.zcount(self.keys.backend_inflight(backend.backend_id),
                                                 f"({self.clock()}", "+inf"))  # fmt: skip
        started = time.perf_counter()
        scraped_at = self.clock()
        url = backend.scrape_url()
        try:
            lines = await self._fetch(backend, url)
            load = load_from_lines(lines, backend_id=backend.backend_id, scraped_at=scraped_at)
        except (TimeoutError, httpx.HTTPError, ValueError) as exc:
            load = self._failed(backend, url, scraped_at, exc)
        self.stats.scrapes += 1
        load = dataclasses.replace(
            load, in_flight_at_scrape=in_flight, scrape_ms=round(1000 * (time.perf_counter() - started), 3)
        )
        await self.client.set(self.keys.backend_load(backend.backend_id), load.encode(),
                              px=int(BACKEND_LOAD_TTL_S * 1000))  # fmt: skip

    async def _fetch(self, backend: BackendConfig, url: str) -> SampleLines:
        """The body's sample lines, read within the backend's budget and size cap."""
        lines = SampleLines(backend.kind)
        await read_bounded(
            self._http, url, budget_s=backend.metrics_timeout_s, connect_s=backend.connect_timeout_s,
            cap=backend.metrics_max_bytes, feed=lines.feed, what="metrics",
        )  # fmt: skip
        return lines

    def _failed(self, backend: BackendConfig, url: str, scraped_at: float, exc: Exception) -> BackendLoad:
        """The shared load of a failed scrape: refused (the backend answered unusable metrics) or
        unreachable (it did not answer in time, or with an HTTP error)."""
        self.stats.failures += 1
        error, refused = failure_words(exc, url, budget_s=backend.metrics_timeout_s, what="metrics")
        if self.stats.failures == 1 or self.stats.failures % 100 == 0:
            word = "refused" if refused else "unreachable"
            log.warning("backend %s metrics %s (%s)", backend.backend_id, word, error)
        return BackendLoad(backend.backend_id, scraped_at, error=error, refused=refused)

    async def close(self) -> None:
        """Waits briefly for scrapes in progress, gives up the leases held (the next scraper takes over
        at once) and closes the HTTP client."""
        running = [t for t in self._scrapes.values() if not t.done()]
        if running:
            _, stuck = await asyncio.wait(running, timeout=CLOSE_WAIT_S)
            for task in stuck:
                task.cancel()
        self._scrapes = {}
        for backend_id in sorted(self.stats.leases_held):
            with contextlib.suppress(*REDIS_ERRORS):
                await self._release(keys=[self.keys.backend_scrape_lease(backend_id)], args=[self.owner_id])
        self.stats.leases_held = set()
        await self._http.aclose()


async def read_bounded(
    http: httpx.AsyncClient,
    url: str,
    *,
    budget_s: float,
    connect_s: float,
    cap: int,
    feed: Callable[[bytes], None],
    what: str,
    headers: Mapping[str, str] | None = None,
) -> None:
    """GETs ``url`` and feeds its body, chunk by chunk, to ``feed``: within ``budget_s`` from connect
    to last byte and at most ``cap`` bytes (``what`` names the body in the refusal). Raises
    TimeoutError, httpx.HTTPError, or MetricsRefused (a ValueError) over the cap."""
    timeout = httpx.Timeout(budget_s, connect=min(budget_s, connect_s))
    # The budget bounds the whole read: httpx's own timeouts are per read, and a server
    # dripping a byte at a time would never trip them.
    # Uncompressed: the cap then bounds what is read, not a gzip bomb's expansion.
    sent = {**(headers or {}), "accept-encoding": "identity"}
    async with asyncio.timeout(budget_s), http.stream("GET", url, timeout=timeout, headers=sent) as response:
        response.raise_for_status()
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise MetricsRefused(f"the {what} body is {declared} bytes, over the cap ({cap} bytes)")
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > cap:
                raise MetricsRefused(f"the {what} body is over the cap ({cap} bytes)")
            feed(chunk)


def failure_words(exc: Exception, url: str, *, budget_s: float, what: str) -> tuple[str, bool]:
    """A failed bounded read in words (the URL redacted), and whether the answer was refused (it came,
    but unusable: a ValueError) rather than missing (a timeout or an HTTP error)."""
    refused = isinstance(exc, ValueError)
    if isinstance(exc, TimeoutError):
        error = f"no whole answer within {budget_s:g}s ({what} timeout)"
    elif refused:
        error = str(exc)[:300]
    else:
        error = f"{type(exc).__name__}: {exc}"[:200].replace(url, redact_url(url))
    return error or type(exc).__name__, refused


def _log_crash(what: str) -> None:
    log.exception(what)
