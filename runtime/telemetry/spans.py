"""The dispatcher's span for each request it executed or dropped, via the OpenTelemetry API.

Spans are created after the fact with explicit start and end times, as children of the producer's
submit span (its W3C context travels in the envelope). Without an SDK provider these are no-ops.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import field
from typing import Any
from urllib.parse import urlsplit

import orjson
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from runtime.immutable import immutable
from runtime.telemetry import semconv
from runtime.wire.contract import ChatCall, CompletionsCall, Envelope

_propagator = TraceContextTextMapPropagator()
_NO_PARENT = Context()  # what the propagator extracts from a request without trace context


@immutable
class Identity:
    group_id: str
    gateway_id: str
    dispatcher_id: str


@immutable
class Subject:
    """The request a span is about: what history needs of it, without the call's content.

    Built from the envelope, or from a lease record when the envelope is gone (a lost call).
    """

    request_id: str
    producer_id: str
    pool_id: str
    model: str
    message_count: int
    enqueued_at: float
    trace: Mapping[str, str]
    labels: Mapping[str, str] = field(default_factory=dict)  # the producer's free-form labels
    tenant: str | None = None  # issue 22: None for untagged traffic
    operation: str = "chat"  # gen_ai.operation.name: chat, embeddings or text_completion

    @classmethod
    def of(cls, envelope: Envelope) -> Subject:
        return cls(
            request_id=envelope.request_id,
            producer_id=envelope.producer_id,
            pool_id=envelope.pool_id,
            model=envelope.call.model,
            message_count=envelope.call.message_count,
            enqueued_at=envelope.enqueued_at,
            trace=envelope.trace,
            labels=envelope.metadata.labels,
            tenant=envelope.tenant,
            operation=envelope.call.operation,
        )


@immutable
class Outcome:
    status: str  # "ok" | "error" | "dropped"
    started_at: float  # wall-clock seconds: execution start, or drop time
    ended_at: float
    backend_url: str = ""
    error_type: str = ""
    error_message: str = ""
    drop_reason: str = ""
    input_tokens: int | None = None
    output_tokens: int | None = None
    response_model: str | None = None
    reply_delivered: bool = False
    cost: int = 0
    attempt: int = 1  # which execution of the request this span is (1 = first)
    time_to_first_token_s: float | None = None  # streamed calls only
    chunk_count: int | None = None  # streamed calls only


def content_attributes(envelope: Envelope, completion: Mapping[str, Any] | None) -> dict[str, str]:
    """Prompt and completion text as GenAI attributes; only used when an operator opted in.

    A call without messages records its request body's own input (``input``, ``prompt``); vectors
    are never stored, only the completions' texts."""
    call = envelope.call
    sent: Any = list(call.messages) if isinstance(call, ChatCall) else call.to_openai()
    content = {semconv.GEN_AI_INPUT_MESSAGES: orjson.dumps(sent).decode()}
    choices = completion.get("choices") if completion else None
    if isinstance(call, CompletionsCall) and isinstance(choices, list):
        texts = [c.get("text") for c in choices if isinstance(c, dict)]
        content[semconv.GEN_AI_OUTPUT_MESSAGES] = orjson.dumps(texts).decode()
    elif isinstance(choices, list):
        messages = [c.get("message") for c in choices if isinstance(c, dict)]
        content[semconv.GEN_AI_OUTPUT_MESSAGES] = orjson.dumps(messages).decode()
    return content


@functools.lru_cache(maxsize=64)
def _server_of(url: str) -> tuple[str | None, int | None]:
    """Host and port of a backend URL; every span of an endpoint asks, so each is parsed once."""
    parts = urlsplit(url)
    return parts.hostname, parts.port


def record_span(
    tracer: trace.Tracer,
    request: Envelope | Subject,
    who: Identity,
    outcome: Outcome,
    content: Mapping[str, Any] | None = None,
) -> None:
    """Emits one CLIENT span for a dispatched (or dropped) request."""
    subject = request if isinstance(request, Subject) else Subject.of(request)
    # Most requests carry no trace context: extracting from an empty carrier gives an empty context.
    parent = _propagator.extract(dict(subject.trace)) if subject.trace else _NO_PARENT
    queue_wait = max(0.0, outcome.started_at - subject.enqueued_at)
    attributes: dict[str, Any] = {
        semconv.GEN_AI_OPERATION_NAME: subject.operation,
        semconv.GEN_AI_REQUEST_MODEL: subject.model,
        semconv.REQUEST_ID: subject.request_id,
        semconv.PRODUCER_ID: subject.producer_id,
        semconv.POOL_ID: subject.pool_id,
        semconv.GROUP_ID: who.group_id,
        semconv.GATEWAY_ID: who.gateway_id,
        semconv.DISPATCHER_ID: who.dispatcher_id,
        semconv.MESSAGE_COUNT: subject.message_count,
        semconv.QUEUE_WAIT_S: queue_wait,
        semconv.EXECUTION_S: max(0.0, outcome.ended_at - outcome.started_at),
        semconv.TOTAL_S: max(0.0, outcome.ended_at - subject.enqueued_at),
        semconv.STATUS: outcome.status,
        semconv.REPLY_DELIVERED: outcome.reply_delivered,
        semconv.COST_UNITS: outcome.cost,
        semconv.ATTEMPT: outcome.attempt,
        semconv.SPAN_KIND_ROLE: "dispatcher",
    }
    if outcome.backend_url:
        attributes[semconv.BACKEND_URL] = outcome.backend_url
        host, port = _server_of(outcome.backend_url)
        if host:
            attributes[semconv.SERVER_ADDRESS] = host
        if port:
            attributes[semconv.SERVER_PORT] = port
    for label, value in subject.labels.items():
        attributes[f"{semconv.LABEL_PREFIX}{label}"] = value
    # The optional attributes, set only when they say something (no empty strings, no None), in one
    # pass over a fixed tuple rather than an intermediate dict per span.
    for key, said in (
        (semconv.ERROR_TYPE, outcome.error_type),
        (semconv.ERROR_MESSAGE, outcome.error_message),
        (semconv.DROP_REASON, outcome.drop_reason),
        (semconv.GEN_AI_USAGE_INPUT_TOKENS, outcome.input_tokens),
        (semconv.GEN_AI_USAGE_OUTPUT_TOKENS, outcome.output_tokens),
        (semconv.GEN_AI_RESPONSE_MODEL, outcome.response_model),
        (semconv.TIME_TO_FIRST_TOKEN_S, outcome.time_to_first_token_s),
        (semconv.CHUNK_COUNT, outcome.chunk_count),
        (semconv.TENANT, subject.tenant),
    ):
        if said is not None and said != "":
            attributes[key] = said
    if content:
        attributes.update(content)
    span = tracer.start_span(
        f"{subject.operation} {subject.model}",
        context=parent,
        kind=trace.SpanKind.CLIENT,
        attributes=attributes,
        start_time=int(subject.enqueued_at * 1e9),
    )
    if outcome.status != "ok":
        span.set_status(trace.Status(trace.StatusCode.ERROR, outcome.error_message or outcome.drop_reason))
    span.end(end_time=int(outcome.ended_at * 1e9))
