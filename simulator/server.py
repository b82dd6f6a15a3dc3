"""An OpenAI-compatible backend simulator: a real HTTP server (aiohttp) for tests, demos and benchmarks.

It answers:

* ``POST /v1/chat/completions``: a ``chat.completion`` with ``usage``, or with ``"stream": true``
  server-sent ``chat.completion.chunk`` events (role, content deltas, finish, optional usage, ``[DONE]``);
* ``POST /v1/completions`` (legacy): the same as a ``text_completion``, streamed or not;
* ``POST /v1/embeddings``: deterministic unit vectors of the requested ``dimensions``, floats or base64
  (see :mod:`simulator.endpoints_format`);
* ``GET /v1/models``, ``GET /health``;
* ``GET /metrics``: Prometheus text with vLLM's (or SGLang's, llama.cpp's, TGI's) running / waiting /
  KV-cache gauges and ``sim_*`` counters (see :mod:`simulator.metrics`); kind ``openai`` has none (404).

Behaviour comes from a frozen :class:`~simulator.config.SimulatorConfig`; this module routes each
request and keeps the server's lifecycle and observable state, :mod:`simulator.handlers` answers the
calls through a vLLM-like :class:`~simulator.engine.Engine`. A request body may carry a ``"sim"`` object that
overrides behaviour for that one request (see :data:`~simulator.openai_format.SIM_KEYS`).

With zero latency and zero token time a completion never awaits, so the server is usable as the
zero-latency backend of throughput benchmarks.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
import time
from collections import Counter
from http import HTTPStatus

import orjson
from aiohttp import web

from simulator.behaviour import Behaviour
from simulator.config import SimulatorConfig
from simulator.engine import Engine
from simulator.handlers import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    EMBEDDINGS_PATH,
    CallHandlers,
    error_response,
    json_response,
)
from simulator.metrics import CONTENT_TYPE, Counters, SimulatorCollector, exposition, registry_for

__all__ = ["SimulatorConfig", "SimulatorServer", "serve"]

KNOWN_PATHS = (CHAT_PATH, COMPLETIONS_PATH, EMBEDDINGS_PATH, "/v1/models", "/health", "/metrics")
OTHER_PATH = "other"
# A stopping server gives in-flight calls this long before cancelling them: a simulator drains nothing.
SHUTDOWN_TIMEOUT_S = 0.25


class SimulatorServer:
    """The simulator bound to a TCP port. ``async with SimulatorServer(cfg) as sim: ... sim.url``."""

    def __init__(self, config: SimulatorConfig | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config or SimulatorConfig()
        self.host = host
        self._requested_port = port
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._behaviour = Behaviour(self.config, random.Random(self.config.seed))
        self._counters = Counters(requests_by_path=dict.fromkeys((*KNOWN_PATHS, OTHER_PATH), 0))
        self.engine = Engine(
            max_running=self.config.max_running,
            kv_capacity=self.config.kv_cache_tokens,
            clock=time.monotonic,
        )
        collector = SimulatorCollector(
            kind=self.config.kind, model=self.config.model, engine=self, counters=self._counters
        )
        self._registry = registry_for(collector)
        self._calls = CallHandlers(self.config, self._behaviour, self.engine, self._counters)
        self._stop_event: asyncio.Event | None = None
        self._models_body = orjson.dumps(
            {
                "object": "list",
                "data": [{"id": self.config.model, "object": "model", "created": 0, "owned_by": "simulator"}],
            }
        )
        self._routes = {
            CHAT_PATH: ("POST", self._calls.chat),
            COMPLETIONS_PATH: ("POST", self._calls.completions),
            EMBEDDINGS_PATH: ("POST", self._calls.embeddings),
            "/v1/models": ("GET", self._models),
            "/health": ("GET", self._health),
            "/metrics": ("GET", self._metrics),
        }

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("simulator already started")
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a client that leaves cancels its call, freeing its slot, as vLLM aborts.
        runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=SHUTDOWN_TIMEOUT_S
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, self._requested_port, backlog=1024)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> SimulatorServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        """Serve until :meth:`request_stop` (or SIGINT/SIGTERM when handlers are installed)."""
        self._stop_event = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM) if install_signal_handlers else ()
        for sig in signals:
            loop.add_signal_handler(sig, self._stop_event.set)
        try:
            await self.start()
            await self._stop_event.wait()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            await self.stop()

    def request_stop(self) -> None:
        if self._stop_event is not None:
            self._stop_event.set()

    # -- observable state --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        if self.port is None:
            raise RuntimeError("simulator not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def running(self) -> int:
        return len(self.engine.running)

    @property
    def waiting(self) -> int:
        return self.engine.waiting

    def kv_usage(self) -> float:
        """Fraction of the KV cache held by running calls now (0 with an unlimited cache)."""
        return self.engine.kv_usage()

    @property
    def calls_by_user(self) -> Counter[str]:
        """Calls received per OpenAI ``user`` field: tests give each request a unique ``user`` to prove
        nothing ran twice."""
        return self._calls.calls_by_user

    @property
    def peak_active_by_model(self) -> Counter[str]:
        """The most calls in progress (running or waiting) at once per model: a model per pool tests caps."""
        return self._calls.peak_active_by_model

    @property
    def peak_active(self) -> int:
        """The most calls in progress at once, over every model."""
        return self._calls.peak_active

    @property
    def requests_total(self) -> int:
        """Every HTTP request received, whatever its path or outcome."""
        return sum(self._counters.requests_by_path.values())

    @property
    def requests_by_path(self) -> dict[str, int]:
        """Requests received per known path; unknown paths count under ``"other"``."""
        return dict(self._counters.requests_by_path)

    @property
    def completions_requested(self) -> int:
        return self._counters.requests_by_path[CHAT_PATH]

    @property
    def completions_total(self) -> int:
        """Chat completions answered with 200."""
        return self._counters.completions_total

    @property
    def errors_total(self) -> int:
        """Responses with a status >= 400."""
        return sum(self._counters.errors_by_status.values())

    @property
    def errors_by_status(self) -> dict[int, int]:
        return dict(self._counters.errors_by_status)

    @property
    def calls_by_key(self) -> dict[str, int]:
        """Chat calls received per ``sim.key`` (how often the backend saw each keyed request)."""
        return dict(self._behaviour.calls_by_key)

    def metrics_text(self) -> str:
        """Prometheus text exposition (format 0.0.4)."""
        return exposition(self._registry).decode()

    def __repr__(self) -> str:
        where = self.url if self.port is not None else "not started"
        return (
            f"<SimulatorServer {where} model={self.config.model!r} running={self.running} "
            f"waiting={self.waiting} served={self._counters.completions_total} "
            f"errors={self.errors_total}>"
        )

    # -- requests ---------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        by_path = self._counters.requests_by_path
        by_path[path if path in by_path else OTHER_PATH] += 1
        response = await self._route(request)
        if response.status >= 400:
            errors = self._counters.errors_by_status
            errors[response.status] = errors.get(response.status, 0) + 1
        return response

    async def _route(self, request: web.Request) -> web.StreamResponse:
        method, path = request.method, request.path
        route = self._routes.get(path)
        if route is None:
            return error_response(HTTPStatus.NOT_FOUND, f"no route for {method} {path}")
        allowed, handler = route
        if method != allowed:
            return error_response(
                HTTPStatus.METHOD_NOT_ALLOWED, f"{method} not allowed on {path}; use {allowed}"
            )
        return await handler(request)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return json_response(HTTPStatus.OK, self._models_body)

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return json_response(HTTPStatus.OK, b'{"status":"ok"}')

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        if self.config.kind == "openai":  # as Ollama or a hosted API: no Prometheus endpoint
            return error_response(HTTPStatus.NOT_FOUND, "this server exports no metrics")
        return web.Response(body=exposition(self._registry), headers={"Content-Type": CONTENT_TYPE})


async def serve(server: SimulatorServer, *, install_signal_handlers: bool = True) -> None:
    """Run ``server`` until SIGINT/SIGTERM, announcing its URL once it listens."""
    task = asyncio.create_task(server.run(install_signal_handlers=install_signal_handlers))
    while server.port is None and not task.done():
        await asyncio.sleep(0.01)
    if server.port is not None:
        print(f"simulator listening on {server.url} ({server.config})", flush=True)
    await task


if __name__ == "__main__":  # ``python -m simulator.server``, kept for older spawn sites
    from simulator.__main__ import main

    sys.exit(main())
