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

Behaviour comes from a frozen :class:`~simulator.config.SimulatorConfig`; calls run through a
vLLM-like :class:`~simulator.engine.Engine`. A request body may carry a ``"sim"`` object that
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
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web

from simulator import endpoints_format as endpoints
from simulator import openai_format as fmt
from simulator.behaviour import Behaviour
from simulator.config import SimulatorConfig
from simulator.engine import Engine, Job, Timing
from simulator.metrics import CONTENT_TYPE, Counters, SimulatorCollector, exposition, registry_for

__all__ = ["SimulatorConfig", "SimulatorServer", "serve"]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
KNOWN_PATHS = (CHAT_PATH, COMPLETIONS_PATH, EMBEDDINGS_PATH, "/v1/models", "/health", "/metrics")
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
        self._behaviour = Behaviour(self.config, random.Random(self.config.seed))
        self._retry_after = {"Retry-After": str(self.config.retry_after_s)}
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
            COMPLETIONS_PATH: ("POST", self._completions),
            EMBEDDINGS_PATH: ("POST", self._embeddings),
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
        if self.config.kind == "openai":  # as Ollama or a hosted API: no Prometheus endpoint
            return _error(HTTPStatus.NOT_FOUND, "this server exports no metrics")
        return web.Response(body=exposition(self._registry), headers={"Content-Type": CONTENT_TYPE})

    # -- chat completions ----------------------------------------------------------------------------

    async def _read_chat(
        self, request: web.Request, check: Callable[[Any], str] = fmt.check_request
    ) -> dict[str, Any] | web.Response:
        """The parsed request, or the refusal to send (``check`` says what the endpoint refuses)."""
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
        problem = check(body)
        if problem:
            return _error(HTTPStatus.BAD_REQUEST, problem)
        return body

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, legacy=False)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, legacy=True)

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        body = await self._read_chat(request, endpoints.check_embeddings)
        if isinstance(body, web.Response):
            return body
        sim: dict[str, Any] = body.get("sim") or {}
        plan = self._behaviour.plan(body, sim)
        answer, tokens = endpoints.embeddings_body(body, self.config.model)
        # An embedding is one forward pass: it holds its prompt for its latency and generates nothing.
        job = Job(tokens, Timing(plan.latency_s, 0.0, 0))
        await self.engine.start(job)
        try:
            await self._sleep_until(job, plan.latency_s)
            if plan.status:
                return _error(plan.status, plan.message, self._error_headers(plan.status, sim))
            self._counters.prompt_tokens_total += tokens
            return _json(HTTPStatus.OK, answer)
        finally:
            self.engine.finish(job)

    async def _generate(self, request: web.Request, *, legacy: bool) -> web.StreamResponse:
        """A chat completion, or a legacy text completion: the same engine, another shape."""
        body = await self._read_chat(request, endpoints.check_completions if legacy else fmt.check_request)
        if isinstance(body, web.Response):
            return body
        model = body.get("model")
        model = model if isinstance(model, str) else ""
        user = body.get("user")
        if isinstance(user, str):
            self.calls_by_user[user] += 1
        if self._behaviour.rate_limited():
            return _error(
                HTTPStatus.TOO_MANY_REQUESTS,
                f"simulated rate limit (rate_limit_rate={self.config.rate_limit_rate})",
                self._retry_after,
            )
        self._enter(model)
        try:
            return await self._run_chat(request, body, legacy)
        finally:
            self._active_by_model[model] -= 1

    def _error_headers(self, status: int, sim: dict[str, Any]) -> dict[str, str] | None:
        """``Retry-After``: the hook's ``retry_after`` on any injected error (a 503 may carry one too),
        else the configured one on a 429."""
        if "retry_after" in sim:
            return {"Retry-After": str(sim["retry_after"])}
        return self._retry_after if status == HTTPStatus.TOO_MANY_REQUESTS else None

    async def _run_chat(self, request: web.Request, body: dict[str, Any], legacy: bool) -> web.StreamResponse:
        sim: dict[str, Any] = body.get("sim") or {}
        plan = self._behaviour.plan(body, sim)
        prompt_tokens, last_text = (
            endpoints.prompt_of(body) if legacy else fmt.estimate_prompt(body["messages"])
        )
        job = Job(prompt_tokens, plan.timing)
        if not self.engine.fits(job):
            return _error(
                HTTPStatus.BAD_REQUEST,
                f"the request needs {job.reserved_tokens} tokens of KV cache (prompt {prompt_tokens} + "
                f"completion {plan.completion_tokens}); the cache holds {self.config.kv_cache_tokens}",
            )
        await self.engine.start(job)
        try:
            if plan.hang:
                await asyncio.get_running_loop().create_future()  # until the client disconnects
            if plan.status:
                await self._sleep_until(job, plan.latency_s)
                return _error(plan.status, plan.message, self._error_headers(plan.status, sim))
            reply = fmt.Reply(
                model=model_of(body, self.config.model),
                completion_id=f"{'cmpl' if legacy else 'chatcmpl'}-sim-{self.completions_requested}",
                prompt_tokens=prompt_tokens,
                tokens=fmt.reply_tokens(last_text, plan.completion_tokens),
                finish=plan.finish,
                legacy=legacy,
            )
            if body.get("stream"):
                options = body.get("stream_options") or {}
                return await self._stream(
                    request, job, reply, include_usage=bool(options.get("include_usage"))
                )
            await self._sleep_until(job, job.timing.done_s)
            if sim.get("invalid_body"):
                return web.Response(body=GARBAGE, content_type="text/html")
            self._count_completion(reply)
            return _json(HTTPStatus.OK, reply.body())
        finally:
            self.engine.finish(job)

    async def _stream(
        self, request: web.Request, job: Job, reply: fmt.Reply, *, include_usage: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await self._sleep_until(job, job.timing.first_token_s)
        await response.prepare(request)
        if not reply.legacy:  # a legacy stream has no role to announce
            await response.write(reply.chunk({"role": "assistant", "content": ""}))
        for k, token in enumerate(reply.tokens, start=1):
            await self._sleep_until(job, job.timing.token_at(k))
            await response.write(reply.chunk({"content": token}))
        await response.write(reply.chunk({}, finish=reply.finish))
        if include_usage:
            await response.write(reply.usage_chunk())
        await response.write(fmt.DONE_EVENT)
        self._count_completion(reply)
        await response.write_eof()
        return response

    async def _sleep_until(self, job: Job, offset_s: float) -> None:
        """Sleeps until ``offset_s`` after the call started running; never awaits when that has passed."""
        assert job.started_at is not None
        delay = job.started_at + offset_s - self.engine.clock()
        if delay > 0:
            await asyncio.sleep(delay)

    def _enter(self, model: str) -> None:
        """Counts calls in progress (running or waiting) per model and keeps the peaks, for cap tests."""
        active = self._active_by_model
        active[model] += 1
        if active[model] > self.peak_active_by_model[model]:
            self.peak_active_by_model[model] = active[model]
        self.peak_active = max(self.peak_active, sum(active.values()))

    def _count_completion(self, reply: fmt.Reply) -> None:
        counters = self._counters
        counters.completions_total += 1
        counters.prompt_tokens_total += reply.prompt_tokens
        counters.completion_tokens_total += len(reply.tokens)


def model_of(request: dict[str, Any], default: str) -> str:
    """The model the reply names: the requested one, else the served one."""
    model = request.get("model")
    return model if isinstance(model, str) and model else default


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
