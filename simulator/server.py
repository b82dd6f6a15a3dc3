"""An OpenAI-compatible backend simulator: a real HTTP server (aiohttp) for tests, demos and benchmarks.

It answers:

* ``POST /v1/chat/completions``: a ``chat.completion`` with ``usage``, or with ``"stream": true``
  server-sent ``chat.completion.chunk`` events (role, content deltas, finish, optional usage, ``[DONE]``);
* ``GET /v1/models``, ``GET /health``;
* ``GET /metrics``: Prometheus text with vLLM's (or SGLang's) running / waiting / KV-cache gauges and
  ``sim_*`` counters (see :mod:`simulator.metrics`).

Behaviour comes from a frozen :class:`~simulator.config.SimulatorConfig`; calls run through a
vLLM-like :class:`~simulator.engine.Engine`. A request body may carry a ``"sim"`` object that
overrides behaviour for that one request (see :data:`~simulator.openai_format.SIM_KEYS`).

With zero latency and zero token time a completion never awaits, so the server is usable as the
zero-latency backend of throughput benchmarks.
"""

from __future__ import annotations

import asyncio
import math
import random
import signal
import sys
import time
from collections import Counter
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web

from simulator import openai_format as fmt
from simulator.config import SimulatorConfig
from simulator.engine import Engine, Job, Timing
from simulator.metrics import CONTENT_TYPE, Counters, SimulatorCollector, exposition, registry_for

__all__ = ["SimulatorConfig", "SimulatorServer", "serve"]

CHAT_PATH = "/v1/chat/completions"
KNOWN_PATHS = (CHAT_PATH, "/v1/models", "/health", "/metrics")
OTHER_PATH = "other"
JSON = "application/json"
GARBAGE = b"<html>simulated garbage, not a chat completion</html>"
# A stopping server gives in-flight calls this long before cancelling them: a simulator drains nothing.
SHUTDOWN_TIMEOUT_S = 0.25


def _json(status: int, body: bytes, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=body, content_type=JSON, headers=headers)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return _json(status, fmt.error_body(status, message), headers)


class SimulatorServer:
    """The simulator bound to a TCP port. ``async with SimulatorServer(cfg) as sim: ... sim.url``."""

    def __init__(self, config: SimulatorConfig | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config or SimulatorConfig()
        self.host = host
        self._requested_port = port
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._rng = random.Random(self.config.seed)
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
        # Calls in progress per model, their peaks, and calls per OpenAI ``user`` field: tests give
        # each request a unique ``user`` to prove nothing ran twice, and a model per pool for caps.
        self._active_by_model: Counter[str] = Counter()
        self.peak_active_by_model: Counter[str] = Counter()
        self.peak_active = 0
        self.calls_by_user: Counter[str] = Counter()
        self._stop_event: asyncio.Event | None = None
        self._models_body = orjson.dumps(
            {
                "object": "list",
                "data": [{"id": self.config.model, "object": "model", "created": 0, "owned_by": "simulator"}],
            }
        )
        self._routes = {
            CHAT_PATH: ("POST", self._chat),
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
            return _error(HTTPStatus.NOT_FOUND, f"no route for {method} {path}")
        allowed, handler = route
        if method != allowed:
            return _error(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} not allowed on {path}; use {allowed}")
        return await handler(request)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return _json(HTTPStatus.OK, self._models_body)

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return _json(HTTPStatus.OK, b'{"status":"ok"}')

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=exposition(self._registry), headers={"Content-Type": CONTENT_TYPE})

    # -- chat completions ----------------------------------------------------------------------------

    async def _read_chat(self, request: web.Request) -> dict[str, Any] | web.Response:
        """The parsed request, or the refusal to send."""
        refusal = None
        limit = self.config.max_body_bytes
        if "chunked" in request.headers.get("Transfer-Encoding", "").lower():
            refusal = _error(
                HTTPStatus.LENGTH_REQUIRED, "chunked request bodies are not supported; send Content-Length"
            )
        elif (request.content_length or 0) > limit:
            refusal = _error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body over {limit} bytes")
        if refusal is not None:
            refusal.force_close()  # the unread body would otherwise be taken for the next request
            return refusal
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(HTTPStatus.BAD_REQUEST, "request body is not valid JSON")
        problem = fmt.check_request(body)
        if problem:
            return _error(HTTPStatus.BAD_REQUEST, problem)
        return body

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._read_chat(request)
        if isinstance(body, web.Response):
            return body
        sim: dict[str, Any] = body.get("sim") or {}
        model = body.get("model")
        model = model if isinstance(model, str) else ""
        user = body.get("user")
        if isinstance(user, str):
            self.calls_by_user[user] += 1
        if self._draw(self.config.rate_limit_rate):
            return _error(
                HTTPStatus.TOO_MANY_REQUESTS,
                f"simulated rate limit (rate_limit_rate={self.config.rate_limit_rate})",
                {"Retry-After": str(self.config.retry_after_s)},
            )
        self._enter(model)
        try:
            return await self._run_chat(request, body, sim)
        finally:
            self._active_by_model[model] -= 1

    async def _run_chat(
        self, request: web.Request, body: dict[str, Any], sim: dict[str, Any]
    ) -> web.StreamResponse:
        prompt_tokens, last_text = fmt.estimate_prompt(body["messages"])
        completion_tokens, finish = self._completion_tokens(body, sim)
        hang = bool(sim.get("hang")) or self._draw(self.config.hang_rate)
        status, message = self._outcome(sim)
        latency = self._latency_s(sim)
        job = Job(prompt_tokens, self._timing(sim, latency, 0 if status else completion_tokens))
        if not self.engine.fits(job):
            return _error(
                HTTPStatus.BAD_REQUEST,
                f"the request needs {job.reserved_tokens} tokens of KV cache (prompt {prompt_tokens} + "
                f"completion {completion_tokens}); the cache holds {self.config.kv_cache_tokens}",
            )
        await self.engine.start(job)
        try:
            if hang:
                await asyncio.get_running_loop().create_future()  # until the client disconnects
            if status:
                await self._sleep_until(job, latency)
                headers = {"Retry-After": str(self.config.retry_after_s)} if status == 429 else None
                return _error(status, message, headers)
            tokens = fmt.reply_tokens(last_text, completion_tokens)
            call = _Call(body, self.config.model, self._next_id(), prompt_tokens, tokens, finish)
            if body.get("stream"):
                return await self._stream(request, job, call)
            await self._sleep_until(job, job.timing.done_s)
            if sim.get("invalid_body"):
                return web.Response(body=GARBAGE, content_type="text/html")
            self._count_completion(call)
            return _json(HTTPStatus.OK, call.body())
        finally:
            self.engine.finish(job)

    async def _stream(self, request: web.Request, job: Job, call: _Call) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await self._sleep_until(job, job.timing.first_token_s)
        await response.prepare(request)
        await response.write(call.chunk({"role": "assistant", "content": ""}))
        for k, token in enumerate(call.tokens, start=1):
            await self._sleep_until(job, job.timing.token_at(k))
            await response.write(call.chunk({"content": token}))
        await response.write(call.chunk({}, finish=call.finish))
        options = call.request.get("stream_options") or {}
        if options.get("include_usage"):
            await response.write(call.usage_chunk())
        await response.write(fmt.DONE_EVENT)
        self._count_completion(call)
        await response.write_eof()
        return response

    async def _sleep_until(self, job: Job, offset_s: float) -> None:
        """Sleeps until ``offset_s`` after the call started running; never awaits when that has passed."""
        assert job.started_at is not None
        delay = job.started_at + offset_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def _enter(self, model: str) -> None:
        """Counts calls in progress (running or waiting) per model and keeps the peaks, for cap tests."""
        active = self._active_by_model
        active[model] += 1
        if active[model] > self.peak_active_by_model[model]:
            self.peak_active_by_model[model] = active[model]
        self.peak_active = max(self.peak_active, sum(active.values()))

    def _draw(self, probability: float) -> bool:
        # Draw only when the fault is configured, so seeded runs keep their sequence without it.
        return probability > 0 and self._rng.random() < probability

    def _latency_s(self, sim: dict[str, Any]) -> float:
        if "latency_ms" in sim:
            return float(sim["latency_ms"]) / 1000.0
        base = self.config.latency_ms
        if base <= 0:
            return 0.0
        sigma = self.config.latency_sigma
        return base * (math.exp(self._rng.gauss(0.0, sigma)) if sigma > 0 else 1.0) / 1000.0

    def _timing(self, sim: dict[str, Any], latency_s: float, tokens: int) -> Timing:
        ttft_ms = float(sim.get("ttft_ms", self.config.ttft_ms))
        interval = float(sim["itl_ms"]) / 1000.0 if "itl_ms" in sim else self.config.token_interval_s
        return Timing(first_token_s=latency_s + ttft_ms / 1000.0, token_interval_s=interval, tokens=tokens)

    def _outcome(self, sim: dict[str, Any]) -> tuple[int, str]:
        """(status, message) of an injected error, or (0, "") for success."""
        status = sim.get("status")
        if status is not None and status >= 400:
            return status, str(sim.get("message") or f"simulated error {status}")
        if status is None and self._draw(self.config.error_rate):
            status = self._rng.choice(self.config.error_statuses)
            return status, f"simulated error {status} (error_rate={self.config.error_rate})"
        return 0, ""

    def _completion_tokens(self, request: dict[str, Any], sim: dict[str, Any]) -> tuple[int, str]:
        wanted = sim.get("completion_tokens", self.config.default_completion_tokens)
        limit = request.get("max_completion_tokens") or request.get("max_tokens")
        if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < wanted:
            return limit, "length"
        return wanted, "stop"

    def _next_id(self) -> str:
        return f"chatcmpl-sim-{self.requests_by_path[CHAT_PATH]}"

    def _count_completion(self, call: _Call) -> None:
        counters = self._counters
        counters.completions_total += 1
        counters.prompt_tokens_total += call.prompt_tokens
        counters.completion_tokens_total += len(call.tokens)


class _Call:
    """One successful chat completion being answered: what every body and chunk of it repeats."""

    def __init__(
        self,
        request: dict[str, Any],
        default_model: str,
        completion_id: str,
        prompt_tokens: int,
        tokens: list[str],
        finish: str,
    ) -> None:
        model = request.get("model")
        self.request = request
        self.model = model if isinstance(model, str) and model else default_model
        self.completion_id = completion_id
        self.created = int(time.time())
        self.prompt_tokens = prompt_tokens
        self.tokens = tokens
        self.finish = finish

    def usage(self) -> dict[str, int]:
        return fmt.usage(self.prompt_tokens, len(self.tokens))

    def body(self) -> bytes:
        return fmt.completion_body(
            completion_id=self.completion_id,
            created=self.created,
            model=self.model,
            content="".join(self.tokens),
            finish=self.finish,
            usage=self.usage(),
        )

    def chunk(self, delta: dict[str, str], finish: str | None = None) -> bytes:
        return fmt.chunk_event(
            completion_id=self.completion_id,
            created=self.created,
            model=self.model,
            delta=delta,
            finish=finish,
        )

    def usage_chunk(self) -> bytes:
        return fmt.chunk_event(
            completion_id=self.completion_id, created=self.created, model=self.model, usage=self.usage()
        )


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
