"""The OpenAI-compatible ingress as a bare ASGI app: ``POST /v1/chat/completions``, ``/v1/embeddings``
and ``/v1/completions`` (legacy, streamed or not) through the queue, and ``GET /v1/models``.

It sits beside Django in the ASGI router (``dispatch_project.asgi``), not behind it: no session, CSRF,
middleware or template machinery on its path. Each web process is one producer, with its own
``producer_id``, liveness key and reply pump, so the dispatchers' liveness checks cover ingress callers.
A client that disconnects withdraws its request (queued: never executed; running: cut off). A
request's pool is its model alias's, else its pool header's, else its key's default
(:mod:`ingress.aliases`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from ingress.aliases import POOL_HEADER, alias_models, choose_pool, route_request
from ingress.errors import ApiError, api_error_for, invalid_request
from ingress.grants import GrantCache
from ingress.http import (
    ClientGone,
    Receive,
    Scope,
    Send,
    read_body,
    request_headers,
    send_error,
    send_json,
    wait_for_disconnect,
)
from ingress.models_list import ModelLister
from ingress.selectors import KeyGrant
from ingress.streaming import send_stream
from ingress.tenancy import call_tenant
from runtime.errors import DispatchError, MalformedEnvelope, QueueUnavailable
from runtime.producer import Producer
from runtime.valkey.client import REDIS_ERRORS
from runtime.wire.contract import ChatCall, CompletionsCall, EmbeddingsCall, Metadata

log = logging.getLogger(__name__)
CHAT_PATH = "/v1/chat/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
COMPLETIONS_PATH = "/v1/completions"
# The call each POST path queues.
CALL_PATHS: dict[str, type[ChatCall | EmbeddingsCall | CompletionsCall]] = {
    CHAT_PATH: ChatCall,
    EMBEDDINGS_PATH: EmbeddingsCall,
    COMPLETIONS_PATH: CompletionsCall,
}
MODELS_PATH = "/v1/models"
TIMEOUT_HEADER = "x-dispatch-timeout"
REQUEST_ID_HEADER = "x-dispatch-request-id"
QUEUE_WAIT_HEADER = "x-dispatch-queue-wait-ms"
PRODUCER_LABEL = "producer"
ALIAS_LABEL = "model_alias"  # history's label of a request routed by a model alias
__all__ = ["POOL_HEADER", "Ingress", "choose_pool", "parse_body", "parse_stream", "parse_timeout"]
# How often a key's "last used" is written: at most once a minute per key and process.
LAST_USED_EVERY_S = 60.0


class Ingress:
    """The ASGI app. ``producer`` is started lazily inside the server's event loop."""

    def __init__(
        self,
        *,
        make_producer: Callable[[], Producer],
        grants: GrantCache,
        models: ModelLister,
        mark_used: Callable[[int], Awaitable[None]],
        max_body_bytes: int,
        default_timeout_s: float,
    ) -> None:
        self.make_producer = make_producer
        self.grants = grants
        self.models = models
        self.mark_used = mark_used
        self.max_body_bytes = max_body_bytes
        self.default_timeout_s = default_timeout_s
        self.open_by_key: Counter[int] = Counter()
        self._producer: Producer | None = None
        self._producer_lock = asyncio.Lock()
        self._used_at: dict[int, float] = {}
        self._background: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"<Ingress producer={self._producer!r} open={sum(self.open_by_key.values())}>"

    async def producer(self) -> Producer:
        if self._producer is None:
            async with self._producer_lock:
                if self._producer is None:
                    producer = self.make_producer()
                    try:
                        await producer.start()
                    except REDIS_ERRORS as exc:
                        await producer.close()
                        raise QueueUnavailable(f"the queue (Valkey) cannot be reached: {exc}") from exc
                    self._producer = producer
        return self._producer

    async def aclose(self) -> None:
        if self._producer is not None:
            await self._producer.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = uuid.uuid4().hex
        ids = [(REQUEST_ID_HEADER, request_id)]
        try:
            kind = CALL_PATHS.get(scope["path"])
            if kind is not None and scope["method"] == "POST":
                await self._call(scope, receive, send, request_id, kind)
            elif scope["path"] == MODELS_PATH and scope["method"] == "GET":
                await self._models(request_headers(scope), send)
            else:
                raise ApiError(
                    404, f"no route {scope['method']} {scope['path']}", "not_found_error", "no_route"
                )
        except ApiError as error:
            await send_error(send, error, ids)
        except DispatchError as exc:
            await send_error(send, api_error_for(exc), ids)
        except ClientGone:
            return

    async def _authenticate(self, headers: dict[str, str]) -> KeyGrant:
        scheme, _, raw_key = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not raw_key.strip():
            raise ApiError(
                401,
                "missing API key: send Authorization: Bearer <key>",
                "authentication_error",
                "missing_api_key",
            )
        grant = await self.grants.get(raw_key.strip())
        if grant is None:
            raise ApiError(401, "invalid or revoked API key", "authentication_error", "invalid_api_key")
        self._note_use(grant.key_id)
        return grant

    def _note_use(self, key_id: int) -> None:
        now = time.monotonic()
        if now - self._used_at.get(key_id, -math.inf) < LAST_USED_EVERY_S:
            return
        self._used_at[key_id] = now
        task = asyncio.create_task(self.mark_used(key_id))
        self._background.add(task)
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("could not record a producer key's last use: %s", task.exception())

    async def _models(self, headers: dict[str, str], send: Send) -> None:
        """The backend's models behind the key's default pool, and every model alias the key may use."""
        grant = await self._authenticate(headers)
        producer = await self.producer()
        aliases = alias_models(grant, await producer.model_aliases())
        if not grant.default_pool:
            await send_json(send, 200, {"object": "list", "data": aliases})
            return
        listed = await self.models.list(producer, grant.default_pool)
        data = list(listed.get("data") or []) if isinstance(listed, dict) else []
        known = {m.get("id") for m in data if isinstance(m, dict)}
        await send_json(send, 200, {**listed, "data": data + [m for m in aliases if m["id"] not in known]})

    async def _call(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        request_id: str,
        kind: type[ChatCall | EmbeddingsCall | CompletionsCall],
    ) -> None:
        headers = request_headers(scope)
        grant = await self._authenticate(headers)
        timeout_s = parse_timeout(headers.get(TIMEOUT_HEADER), self.default_timeout_s)
        body = parse_body(await read_body(receive, headers, self.max_body_bytes))
        stream, include_usage = parse_stream(body)
        if stream and not kind.streams:
            raise invalid_request(f"{scope['path']} does not stream: leave stream out", param="stream")
        producer = await self.producer()
        route = route_request(
            grant, headers.get(POOL_HEADER, ""), body.get("model"), await producer.model_aliases()
        )
        pool_id = route.pool_id
        if route.model is not None:
            body["model"] = route.model
        try:
            call = kind.from_openai(body)
            tenant = call_tenant(grant, headers, body)
        except MalformedEnvelope as exc:
            raise api_error_for(exc) from exc
        labels = {PRODUCER_LABEL: grant.name}
        if route.alias is not None:
            labels[ALIAS_LABEL] = route.alias
        metadata = Metadata(labels=labels)
        # The key's limits are the fleet's: checked in Valkey with the push (a refusal is QueueFull).
        key = grant.limits()
        self.open_by_key[grant.key_id] += 1
        try:
            if stream and not isinstance(call, EmbeddingsCall):
                chat_stream = producer.stream(
                    call, pool_id=pool_id, metadata=metadata, timeout=timeout_s, request_id=request_id,
                    include_usage=include_usage, key=key, tenant=tenant, tenant_weight=grant.tenant_weight,
                )  # fmt: skip
                ids = [(REQUEST_ID_HEADER, request_id)]
                await until_disconnect(receive, send_stream(send, chat_stream, ids))
                return
            submit = producer.submit(
                call, pool_id=pool_id, metadata=metadata, timeout=timeout_s, request_id=request_id, key=key,
                tenant=tenant, tenant_weight=grant.tenant_weight,
            )  # fmt: skip
            result = await until_disconnect(receive, submit)
            if result is None:
                return
        finally:
            self.open_by_key[grant.key_id] -= 1
        await send_json(
            send,
            200,
            result.completion,
            [
                (REQUEST_ID_HEADER, request_id),
                (QUEUE_WAIT_HEADER, f"{result.timing.queue_wait_s * 1000:.3f}"),
            ],
        )


async def until_disconnect(receive: Receive, call: Awaitable[Any]) -> Any:
    """Runs ``call`` until it finishes or the client disconnects (then cancelled, and None returned).

    ``call`` runs in the request's own task, and one watcher task cancels that task if the client goes:
    a second task for the call and an ``asyncio.wait`` over both cost more than the rest of the
    ingress's own code per request (cProfile, bench/RESULTS.md, issue 23 session 7)."""
    task = asyncio.current_task()
    assert task is not None
    gone = asyncio.get_running_loop().create_task(_cancel_when_gone(receive, task))
    try:
        return await call
    except (asyncio.CancelledError, DispatchError):
        # The watcher only finishes by cancelling this task: then the cancellation (and whatever the
        # call raised while it withdrew) is ours, not the server's.
        if not _cancelled_us(gone):
            raise
        if task.uncancel():  # the server cancelled it as well (shutdown): that one stands
            raise asyncio.CancelledError from None
        return None
    finally:
        gone.cancel()


async def _cancel_when_gone(receive: Receive, task: asyncio.Task[Any]) -> None:
    await wait_for_disconnect(receive)
    task.cancel()


def _cancelled_us(watcher: asyncio.Task[None]) -> bool:
    """Whether the watcher saw the client go and cancelled the request's task (its only way to end
    without an exception)."""
    return watcher.done() and not watcher.cancelled() and watcher.exception() is None


def parse_timeout(raw: str | None, default_s: float) -> float:
    if raw is None:
        return default_s
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise invalid_request(
            f"X-Dispatch-Timeout must be a positive number of seconds, got {raw!r}", param=TIMEOUT_HEADER
        )
    return value


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_request(f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise invalid_request(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def parse_stream(body: dict[str, Any]) -> tuple[bool, bool]:
    """Takes ``stream`` and ``stream_options`` out of the body: (stream, include_usage)."""
    stream = body.pop("stream", False)
    options = body.pop("stream_options", None)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise invalid_request(f"stream must be a boolean, got {type(stream).__name__}", param="stream")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise invalid_request("stream_options must be an object", param="stream_options")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise invalid_request(
            "stream_options.include_usage must be a boolean", param="stream_options.include_usage"
        )
    return stream, include_usage
