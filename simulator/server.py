"""An OpenAI-compatible backend simulator: a real HTTP/1.1 server for tests, demos and benchmarks.

It speaks just enough HTTP/1.1 (keep-alive, ``Content-Length`` bodies; chunked request bodies are
refused with 411; see :mod:`simulator.http11`) and answers:

* ``POST /v1/chat/completions``: a non-streaming ``chat.completion`` with ``usage`` in every answer;
* ``GET /v1/models``, ``GET /health``;
* ``GET /metrics``: Prometheus text with vLLM's ``vllm:num_requests_running`` /
  ``vllm:num_requests_waiting`` gauges and ``sim_*`` counters.

Behaviour comes from a frozen :class:`SimulatorConfig`: latency (a median plus lognormal spread),
token speed, injected error rate, a concurrency limit with a FIFO waiting queue, and a seed. A request
body may carry a ``"sim"`` object that overrides behaviour for that one request (see :data:`SIM_KEYS`).

With zero latency and zero token time a completion never awaits, so the server is usable as the
zero-latency backend of throughput benchmarks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import signal
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from simulator.http11 import JSON, HTTP11Server

CHAT_PATH = "/v1/chat/completions"
KNOWN_PATHS = (CHAT_PATH, "/v1/models", "/health", "/metrics")
OTHER_PATH = "other"
# Keys of the per-request ``"sim"`` test hook.
SIM_KEYS = frozenset({"latency_ms", "status", "message", "invalid_body", "completion_tokens"})

_ERROR_KINDS = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", "permission_denied"),
    404: ("invalid_request_error", "not_found"),
    408: ("timeout_error", "timeout"),
    409: ("conflict_error", "conflict"),
    411: ("invalid_request_error", "length_required"),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", "unprocessable"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}


@dataclass(frozen=True)
class SimulatorConfig:
    """How the simulated backend behaves.

    Latency of a call is ``latency_ms * exp(N(0, latency_sigma))`` (a lognormal whose median is
    ``latency_ms``; sigma 0 means a fixed latency), plus ``completion_tokens / tokens_per_second``
    of generation time (0 tokens/s means instant). ``max_running`` calls run at once (0 = unlimited);
    the rest wait in FIFO order and are what ``vllm:num_requests_waiting`` reports. With probability
    ``error_rate`` a call fails, after its latency, with a status drawn from ``error_statuses``.
    """

    model: str = "sim-model"
    latency_ms: float = 0.0
    latency_sigma: float = 0.0
    tokens_per_second: float = 0.0
    default_completion_tokens: int = 16
    error_rate: float = 0.0
    error_statuses: tuple[int, ...] = (500, 503)
    max_running: int = 0
    seed: int | None = None
    max_body_bytes: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        problems = []
        if not self.model:
            problems.append("model must not be empty")
        if not (self.latency_ms >= 0 and math.isfinite(self.latency_ms)):
            problems.append(f"latency_ms must be a finite number >= 0, got {self.latency_ms!r}")
        if not (self.latency_sigma >= 0 and math.isfinite(self.latency_sigma)):
            problems.append(f"latency_sigma must be a finite number >= 0, got {self.latency_sigma!r}")
        if not (self.tokens_per_second >= 0 and math.isfinite(self.tokens_per_second)):
            problems.append(f"tokens_per_second must be >= 0 (0 = instant), got {self.tokens_per_second!r}")
        if self.default_completion_tokens < 0:
            problems.append(f"default_completion_tokens must be >= 0, got {self.default_completion_tokens}")
        if not 0.0 <= self.error_rate <= 1.0:
            problems.append(f"error_rate must be between 0 and 1, got {self.error_rate!r}")
        if not self.error_statuses or any(not 400 <= s <= 599 for s in self.error_statuses):
            problems.append(f"error_statuses must be HTTP error codes (400-599), got {self.error_statuses!r}")
        if self.max_running < 0:
            problems.append(f"max_running must be >= 0 (0 = unlimited), got {self.max_running}")
        if self.max_body_bytes <= 0:
            problems.append(f"max_body_bytes must be > 0, got {self.max_body_bytes}")
        if problems:
            raise ValueError("; ".join(problems))


def error_body(status: int, message: str) -> bytes:
    """OpenAI's error body shape for a status."""
    kind, code = _ERROR_KINDS.get(status, ("server_error", "internal_error"))
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


def _text_of(content: Any) -> tuple[str, int]:
    """The text of a message's content and its number of image parts."""
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        return "", 0
    texts, images = [], 0
    for part in content:
        if isinstance(part, dict):
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif part.get("type") == "image_url":
                images += 1
    return " ".join(texts), images


def estimate_prompt(messages: list[Any]) -> tuple[int, str]:
    """Rough prompt tokens (chars/4 + 4 per message + 85 per image) and the last message's text."""
    tokens, last = 0, ""
    for message in messages:
        text, images = _text_of(message.get("content")) if isinstance(message, dict) else ("", 0)
        tokens += 4 + len(text) // 4 + 85 * images
        last = text
    return tokens, last


@dataclass
class _Counters:
    requests_total: int = 0
    by_path: dict[str, int] = field(default_factory=lambda: dict.fromkeys((*KNOWN_PATHS, OTHER_PATH), 0))
    completions_total: int = 0
    errors_total: int = 0
    errors_by_status: dict[int, int] = field(default_factory=dict)
    prompt_tokens_total: int = 0
    completion_tokens_total: int = 0


class SimulatorServer:
    """The simulator bound to a TCP port. ``async with SimulatorServer(cfg) as sim: ... sim.url``."""

    def __init__(self, config: SimulatorConfig | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config or SimulatorConfig()
        self.host = host
        self._requested_port = port
        self.port: int | None = None
        self._server: HTTP11Server | None = None
        self._rng = random.Random(self.config.seed)
        self._counters = _Counters()
        self._running = 0
        # Calls in progress per model, their peaks, and calls per OpenAI ``user`` field: tests give
        # each request a unique ``user`` to prove nothing ran twice, and a model per pool for caps.
        self._active_by_model: Counter[str] = Counter()
        self.peak_active_by_model: Counter[str] = Counter()
        self.peak_active = 0
        self.calls_by_user: Counter[str] = Counter()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._stop_event: asyncio.Event | None = None
        self._model_label = self.config.model.replace("\\", "\\\\").replace('"', '\\"')
        self._models_body = orjson.dumps(
            {
                "object": "list",
                "data": [{"id": self.config.model, "object": "model", "created": 0, "owned_by": "simulator"}],
            }
        )

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("simulator already started")
        self._server = HTTP11Server(
            self._handle,
            error_body=error_body,
            on_refused=self._count_error,
            max_body_bytes=self.config.max_body_bytes,
        )
        self.port = await self._server.start(self.host, self._requested_port)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop()

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
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def requests_total(self) -> int:
        """Every HTTP request received, whatever its path or outcome."""
        return self._counters.requests_total

    @property
    def requests_by_path(self) -> dict[str, int]:
        """Requests received per known path; unknown paths count under ``"other"``."""
        return dict(self._counters.by_path)

    @property
    def completions_requested(self) -> int:
        return self._counters.by_path[CHAT_PATH]

    @property
    def completions_total(self) -> int:
        """Chat completions answered with 200."""
        return self._counters.completions_total

    @property
    def errors_total(self) -> int:
        """Responses with a status >= 400."""
        return self._counters.errors_total

    @property
    def errors_by_status(self) -> dict[int, int]:
        return dict(self._counters.errors_by_status)

    def __repr__(self) -> str:
        where = self.url if self.port is not None else "not started"
        return (
            f"<SimulatorServer {where} model={self.config.model!r} running={self._running} "
            f"waiting={len(self._waiters)} served={self._counters.completions_total} "
            f"errors={self._counters.errors_total}>"
        )

    # -- requests ---------------------------------------------------------------------------------

    async def _handle(self, method: str, path: str, body: bytes) -> tuple[int, bytes, bytes]:
        counters = self._counters
        counters.requests_total += 1
        counters.by_path[path if path in counters.by_path else OTHER_PATH] += 1
        status, payload, content_type = await self._route(method, path, body)
        if status >= 400:
            self._count_error(status)
        return status, payload, content_type

    def _count_error(self, status: int) -> None:
        self._counters.errors_total += 1
        self._counters.errors_by_status[status] = self._counters.errors_by_status.get(status, 0) + 1

    async def _route(self, method: str, path: str, body: bytes) -> tuple[int, bytes, bytes]:
        if path == CHAT_PATH:
            if method != "POST":
                return 405, error_body(405, f"{method} not allowed on {path}; use POST"), JSON
            return await self._chat(body)
        if path in ("/v1/models", "/health", "/metrics") and method != "GET":
            return 405, error_body(405, f"{method} not allowed on {path}; use GET"), JSON
        if path == "/v1/models":
            return 200, self._models_body, JSON
        if path == "/health":
            return 200, b'{"status":"ok"}', JSON
        if path == "/metrics":
            return 200, self.metrics_text().encode(), b"text/plain; version=0.0.4; charset=utf-8"
        return 404, error_body(404, f"no route for {method} {path}"), JSON

    # -- chat completions ----------------------------------------------------------------------------

    async def _chat(self, body: bytes) -> tuple[int, bytes, bytes]:
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError:
            return 400, error_body(400, "request body is not valid JSON"), JSON
        problem = _check_request(request)
        if problem:
            return 400, error_body(400, problem), JSON
        sim = request.get("sim") or {}
        delay = self._latency_s(sim)
        status, message = self._outcome(sim)
        model = request.get("model") if isinstance(request.get("model"), str) else ""
        user = request.get("user")
        if isinstance(user, str):
            self.calls_by_user[user] += 1
        self._enter(model)
        await self._acquire()
        try:
            if status:
                if delay > 0:
                    await asyncio.sleep(delay)
                return status, error_body(status, message), JSON
            prompt_tokens, last_text = estimate_prompt(request["messages"])
            completion_tokens, finish = self._completion_tokens(request, sim)
            tps = self.config.tokens_per_second
            if tps > 0:
                delay += completion_tokens / tps
            if delay > 0:
                await asyncio.sleep(delay)
            if sim.get("invalid_body"):
                return 200, b"<html>simulated garbage, not a chat completion</html>", b"text/html"
            return 200, self._completion(request, prompt_tokens, completion_tokens, finish, last_text), JSON
        finally:
            self._release()
            self._active_by_model[model] -= 1

    def _enter(self, model: str) -> None:
        """Counts calls in progress (running or waiting) per model and keeps the peaks, for cap tests."""
        active = self._active_by_model
        active[model] += 1
        if active[model] > self.peak_active_by_model[model]:
            self.peak_active_by_model[model] = active[model]
        total = sum(active.values())
        self.peak_active = max(self.peak_active, total)

    def _latency_s(self, sim: dict[str, Any]) -> float:
        if "latency_ms" in sim:
            return float(sim["latency_ms"]) / 1000.0
        base = self.config.latency_ms
        if base <= 0:
            return 0.0
        sigma = self.config.latency_sigma
        return base * (math.exp(self._rng.gauss(0.0, sigma)) if sigma > 0 else 1.0) / 1000.0

    def _outcome(self, sim: dict[str, Any]) -> tuple[int, str]:
        """(status, message) of an injected error, or (0, "") for success."""
        status = sim.get("status")
        if status is not None and status >= 400:
            return status, str(sim.get("message") or f"simulated error {status}")
        if status is None and self.config.error_rate > 0 and self._rng.random() < self.config.error_rate:
            status = self._rng.choice(self.config.error_statuses)
            return status, f"simulated error {status} (error_rate={self.config.error_rate})"
        return 0, ""

    def _completion_tokens(self, request: dict[str, Any], sim: dict[str, Any]) -> tuple[int, str]:
        wanted = sim.get("completion_tokens", self.config.default_completion_tokens)
        limit = request.get("max_completion_tokens") or request.get("max_tokens")
        if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < wanted:
            return limit, "length"
        return wanted, "stop"

    def _completion(
        self, request: dict[str, Any], prompt_tokens: int, completion_tokens: int, finish: str, text: str
    ) -> bytes:
        counters = self._counters
        counters.completions_total += 1
        counters.prompt_tokens_total += prompt_tokens
        counters.completion_tokens_total += completion_tokens
        model = request.get("model")
        content = f"Simulated reply to: {text}"[: max(4 * completion_tokens, 1)]
        return orjson.dumps(
            {
                "id": f"chatcmpl-sim-{counters.completions_total}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model if isinstance(model, str) and model else self.config.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": finish,
                        "logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )

    # -- concurrency limit: running slots with a FIFO of waiters --------------------------------------

    async def _acquire(self) -> None:
        limit = self.config.max_running
        if limit <= 0 or (self._running < limit and not self._waiters):
            self._running += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # the slot was handed over just as we were cancelled: pass it on
            else:
                self._waiters.remove(waiter)
            raise

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # hand the slot over; the running count stays the same
                return
        self._running -= 1

    # -- metrics --------------------------------------------------------------------------------------

    def metrics_text(self) -> str:
        """Prometheus text exposition (format 0.0.4)."""
        c = self._counters
        label = f'model_name="{self._model_label}"'
        lines = [
            "# HELP vllm:num_requests_running Number of requests currently running.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{label}}} {self._running}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to run.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{label}}} {len(self._waiters)}",
            "# HELP vllm:prompt_tokens_total Prompt tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{label}}} {c.prompt_tokens_total}",
            "# HELP vllm:generation_tokens_total Generation tokens produced.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{label}}} {c.completion_tokens_total}",
            "# HELP sim_requests_total HTTP requests received, by path.",
            "# TYPE sim_requests_total counter",
        ]
        lines += [f'sim_requests_total{{path="{path}"}} {n}' for path, n in c.by_path.items()]
        lines += [
            "# HELP sim_completions_total Chat completions answered with 200.",
            "# TYPE sim_completions_total counter",
            f"sim_completions_total{{{label}}} {c.completions_total}",
            "# HELP sim_errors_total Responses with an error status, by status.",
            "# TYPE sim_errors_total counter",
        ]
        lines += [f'sim_errors_total{{status="{s}"}} {n}' for s, n in sorted(c.errors_by_status.items())]
        return "\n".join(lines) + "\n"


def _check_request(request: Any) -> str:
    """Why a chat-completions request is refused with 400, or '' when it is acceptable."""
    if not isinstance(request, dict):
        return "request body must be a JSON object"
    if request.get("stream"):
        return "stream=true is not supported by the simulator; send a non-streaming request"
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    sim = request.get("sim")
    if sim is None:
        return ""
    if not isinstance(sim, dict):
        return "'sim' must be an object"
    unknown = set(sim) - SIM_KEYS
    if unknown:
        return f"unknown 'sim' keys: {sorted(unknown)}; allowed: {sorted(SIM_KEYS)}"
    latency = sim.get("latency_ms", 0)
    if isinstance(latency, bool) or not isinstance(latency, int | float) or not 0 <= latency < 3.6e6:
        return "'sim.latency_ms' must be a number of milliseconds >= 0"
    status = sim.get("status", 200)
    if isinstance(status, bool) or not isinstance(status, int) or not 200 <= status <= 599:
        return "'sim.status' must be an HTTP status between 200 and 599"
    tokens = sim.get("completion_tokens", 0)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        return "'sim.completion_tokens' must be an integer >= 0"
    return ""


def _statuses(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated status codes, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulator.server", description="OpenAI-compatible backend simulator"
    )
    defaults = SimulatorConfig()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--model", default=defaults.model)
    parser.add_argument("--latency-ms", type=float, default=defaults.latency_ms, help="median latency")
    parser.add_argument("--latency-sigma", type=float, default=defaults.latency_sigma, help="lognormal sigma")
    parser.add_argument("--tokens-per-second", type=float, default=defaults.tokens_per_second)
    parser.add_argument("--completion-tokens", type=int, default=defaults.default_completion_tokens)
    parser.add_argument("--error-rate", type=float, default=defaults.error_rate)
    parser.add_argument(
        "--error-statuses", type=_statuses, default=defaults.error_statuses, help="e.g. 429,500,503"
    )
    parser.add_argument("--max-running", type=int, default=defaults.max_running, help="0 = unlimited")
    parser.add_argument("--seed", type=int, default=None)
    return parser


def config_from_args(args: argparse.Namespace) -> SimulatorConfig:
    """Build the config from parsed options; raises ValueError with every problem found."""
    return SimulatorConfig(
        model=args.model,
        latency_ms=args.latency_ms,
        latency_sigma=args.latency_sigma,
        tokens_per_second=args.tokens_per_second,
        default_completion_tokens=args.completion_tokens,
        error_rate=args.error_rate,
        error_statuses=tuple(args.error_statuses),
        max_running=args.max_running,
        seed=args.seed,
    )


async def serve(server: SimulatorServer, *, install_signal_handlers: bool = True) -> None:
    """Run ``server`` until SIGINT/SIGTERM, announcing its URL once it listens."""
    task = asyncio.create_task(server.run(install_signal_handlers=install_signal_handlers))
    while server.port is None and not task.done():
        await asyncio.sleep(0.01)
    if server.port is not None:
        print(f"simulator listening on {server.url} ({server.config})", flush=True)
    await task


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be between 0 and 65535, got {args.port}")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(SimulatorServer(config, host=args.host, port=args.port)))
    except OSError as exc:
        print(f"simulator: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
