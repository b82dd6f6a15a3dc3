"""The simulator's calls: chat completions, legacy text completions and embeddings, as the engine runs them.

Each handler reads and checks its request body, plans its behaviour (latency, injected errors, hangs),
holds its place in the vLLM-like :class:`~simulator.engine.Engine` for as long as the call runs, and
answers in OpenAI's shapes (:mod:`simulator.openai_format`, :mod:`simulator.endpoints_format`),
streamed or not. Routing, lifecycle and the observable state are :mod:`simulator.server`'s.
"""

from __future__ import annotations

import asyncio
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
from simulator.metrics import Counters

__all__ = [
    "CHAT_PATH",
    "COMPLETIONS_PATH",
    "EMBEDDINGS_PATH",
    "CallHandlers",
    "error_response",
    "json_response",
    "model_of",
]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
JSON = "application/json"
GARBAGE = b"<html>simulated garbage, not a chat completion</html>"


def json_response(status: int, body: bytes, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=body, content_type=JSON, headers=headers)


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return json_response(status, fmt.error_body(status, message), headers)


class CallHandlers:
    """Answers the three call endpoints, and counts what the tests read: calls per model and user."""

    def __init__(
        self, config: SimulatorConfig, behaviour: Behaviour, engine: Engine, counters: Counters
    ) -> None:
        self.config = config
        self.behaviour = behaviour
        self.engine = engine
        self.counters = counters
        self._retry_after = {"Retry-After": str(config.retry_after_s)}
        # Calls in progress per model, their peaks, and calls per OpenAI ``user`` field: tests give
        # each request a unique ``user`` to prove nothing ran twice, and a model per pool for caps.
        self._active_by_model: Counter[str] = Counter()
        self.peak_active_by_model: Counter[str] = Counter()
        self.peak_active = 0
        self.calls_by_user: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"<CallHandlers active={sum(self._active_by_model.values())} peak={self.peak_active}>"

    async def _read_chat(
        self, request: web.Request, check: Callable[[Any], str] = fmt.check_request
    ) -> dict[str, Any] | web.Response:
        """The parsed request, or the refusal to send (``check`` says what the endpoint refuses)."""
        refusal = None
        limit = self.config.max_body_bytes
        if "chunked" in request.headers.get("Transfer-Encoding", "").lower():
            refusal = error_response(
                HTTPStatus.LENGTH_REQUIRED, "chunked request bodies are not supported; send Content-Length"
            )
        elif (request.content_length or 0) > limit:
            refusal = error_response(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body over {limit} bytes")
        if refusal is not None:
            refusal.force_close()  # the unread body would otherwise be taken for the next request
            return refusal
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return error_response(HTTPStatus.BAD_REQUEST, "request body is not valid JSON")
        problem = check(body)
        if problem:
            return error_response(HTTPStatus.BAD_REQUEST, problem)
        return body

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, legacy=False)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, legacy=True)

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        body = await self._read_chat(request, endpoints.check_embeddings)
        if isinstance(body, web.Response):
            return body
        sim: dict[str, Any] = body.get("sim") or {}
        plan = self.behaviour.plan(body, sim)
        answer, tokens = endpoints.embeddings_body(body, self.config.model)
        # An embedding is one forward pass: it holds its prompt for its latency and generates nothing.
        job = Job(tokens, Timing(plan.latency_s, 0.0, 0))
        await self.engine.start(job)
        try:
            await self._sleep_until(job, plan.latency_s)
            if plan.status:
                return error_response(plan.status, plan.message, self._error_headers(plan.status, sim))
            self.counters.prompt_tokens_total += tokens
            return json_response(HTTPStatus.OK, answer)
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
        if self.behaviour.rate_limited():
            return error_response(
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
        plan = self.behaviour.plan(body, sim)
        prompt_tokens, last_text = (
            endpoints.prompt_of(body) if legacy else fmt.estimate_prompt(body["messages"])
        )
        job = Job(prompt_tokens, plan.timing)
        if not self.engine.fits(job):
            return error_response(
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
                return error_response(plan.status, plan.message, self._error_headers(plan.status, sim))
            served = self.counters.requests_by_path[CHAT_PATH]  # chat requests so far, this one too
            reply = fmt.Reply(
                model=model_of(body, self.config.model),
                completion_id=f"{'cmpl' if legacy else 'chatcmpl'}-sim-{served}",
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
            return json_response(HTTPStatus.OK, reply.body())
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
        counters = self.counters
        counters.completions_total += 1
        counters.prompt_tokens_total += reply.prompt_tokens
        counters.completion_tokens_total += len(reply.tokens)


def model_of(request: dict[str, Any], default: str) -> str:
    """The model the reply names: the requested one, else the served one."""
    model = request.get("model")
    return model if isinstance(model, str) and model else default
