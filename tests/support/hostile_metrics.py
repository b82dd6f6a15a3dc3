"""A small real aiohttp server answering ``/metrics`` as a broken or hostile backend would.

Each behaviour is a handler: a fixed body (``+Inf``, ``NaN``, a huge body), or a body dripped a byte
at a time. The server counts the scrapes it received, so tests wait for them instead of sleeping.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def vllm_text(
    running: str = "1", waiting: str = "0", kv: str = "0.1", kv_name: str = "kv_cache_usage_perc"
) -> str:
    """A vLLM ``/metrics`` body with the three gauges as given (any Prometheus value text)."""
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="m"}} {running}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
        f"# TYPE vllm:{kv_name} gauge\n"
        f'vllm:{kv_name}{{model_name="m"}} {kv}\n'
    )


def body(text: str | bytes) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.Response(body=text.encode() if isinstance(text, str) else text, content_type="text/plain")

    return handle


def drip(every_s: float, chunk: bytes = b"#") -> Handler:
    """Sends a byte every ``every_s`` seconds, forever: each read is quick, the body never ends."""

    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/plain"})
        await response.prepare(request)
        while True:
            await response.write(chunk)
            await asyncio.sleep(every_s)  # the scenario: a server that trickles its body

    return handle


def streamed(total: int, chunk: bytes = b"# padding " + b"x" * 1014 + b"\n") -> Handler:
    """A body of ``total`` bytes sent without a content length (chunked), as fast as it goes."""

    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/plain"})
        await response.prepare(request)
        sent = 0
        while sent < total:
            await response.write(chunk)
            sent += len(chunk)
        await response.write_eof()
        return response

    return handle


class MetricsServer:
    """``async with MetricsServer(handler) as server``: ``server.url`` is its ``/metrics``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.scrapes = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.scrapes += 1
        return await self.handler(request)

    async def __aenter__(self) -> MetricsServer:
        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/metrics"
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class ThreadedMetricsServer:
    """``with ThreadedMetricsServer(handler) as server``: a :class:`MetricsServer` on an event loop of its
    own thread. A test that measures its loop's CPU (``test_scraper_hostile.LoopWatch``) then measures
    the scraper alone: in the test's own loop, sending an 11 MB body (aiohttp joins and buffers it)
    cost the loop 15 ms of CPU here and 58 ms on a busy CI machine, charged to the scraper."""

    def __init__(self, handler: Handler) -> None:
        self.server = MetricsServer(handler)
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="metrics-server", daemon=True)

    @property
    def url(self) -> str:
        return self.server.url

    async def _run(self) -> None:
        async with self.server:
            self._started.set()
            await self._stop.wait()

    def _serve(self) -> None:
        try:
            self._loop.run_until_complete(self._run())
        except BaseException as exc:  # told to the test's thread, which raises it
            self._failure = exc
        finally:
            self._started.set()
            self._loop.close()

    def __enter__(self) -> ThreadedMetricsServer:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the metrics server's thread did not start within 10 s")
        if self._failure is not None:
            raise self._failure
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
        if self._failure is not None:
            raise self._failure
