"""A small real aiohttp server answering ``/metrics`` as a broken or hostile backend would.

Each behaviour is a handler: a fixed body (``+Inf``, ``NaN``, a huge body), or a body dripped a byte
at a time. The server counts the scrapes it received, so tests wait for them instead of sleeping.
"""

from __future__ import annotations

import asyncio
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
