"""What a submit returns and counts, and how its outcome shows on the producer's span."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace

from runtime.errors import Cancelled, DispatchError, QueueFull, error_from_type
from runtime.immutable import immutable
from runtime.telemetry import semconv
from runtime.wire.contract import Metadata, Reply, Timing

__all__ = [
    "CompletionResult",
    "ProducerStats",
    "fail_span",
    "refused_span",
    "reply_error",
    "submit_span",
    "withdrawn_span",
]


@immutable
class CompletionResult:
    """What ``submit`` returns, the same on the queued and the direct path."""

    request_id: str
    pool_id: str
    completion: Mapping[str, Any]
    timing: Timing


@dataclass(slots=True)
class ProducerStats:
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    rejected: int = 0  # refused at submit by the pool's admission limits (QueueFull)
    timed_out: int = 0
    cancelled: int = 0  # withdrawn by the caller (e.g. an ingress client that disconnected)
    withdrawn_queued: int = 0  # of those, taken back out of their list before any dispatcher saw them
    late_replies: int = 0
    duplicate_replies: int = 0  # a second reply for a request already answered (discarded)
    malformed_replies: int = 0
    pump_reconnects: int = 0
    # Durable pushes answered without the persistence asked for (the reason is in ``persistence``).
    unpersisted_pushes: int = 0
    # Registry reads that found the published configuration missing (Valkey lost it): the producer
    # then keeps checking with its last known configuration (``Producer.configuration``).
    config_missing_reads: int = 0


def reply_error(reply: Reply) -> DispatchError:
    """The typed error a failed reply describes, with the backend's status when it carries one."""
    error_type, message = reply.error_type or "dispatch_error", reply.error_message or ""
    backend = reply.backend
    if backend is None:
        return error_from_type(error_type, message)
    return error_from_type(
        error_type,
        message,
        status_code=backend.status,
        retry_after_s=backend.retry_after_s,
        backend_message=backend.message,
    )


def submit_span(
    tracer: trace.Tracer,
    producer_id: str,
    group_id: str,
    request_id: str,
    pool_id: str,
    model: str,
    metadata: Metadata,
) -> trace.Span:
    """The producer's span of one request: its history row when no dispatcher writes one (refused at
    submit, withdrawn while queued); the parent of the dispatcher's span otherwise."""
    attributes = {
        semconv.REQUEST_ID: request_id,
        semconv.PRODUCER_ID: producer_id,
        semconv.POOL_ID: pool_id,
        semconv.GEN_AI_REQUEST_MODEL: model,
        semconv.SPAN_KIND_ROLE: "producer",
        **{f"{semconv.LABEL_PREFIX}{label}": value for label, value in metadata.labels.items()},
    }
    if group_id:
        attributes[semconv.GROUP_ID] = group_id
    return tracer.start_span(semconv.SPAN_NAME_SUBMIT, kind=trace.SpanKind.PRODUCER, attributes=attributes)


def refused_span(span: trace.Span, exc: QueueFull) -> None:
    # A history row of its own: refused at the door, with the admission limit's reason.
    span.set_attributes({semconv.STATUS: "rejected", semconv.DROP_REASON: exc.reason})
    fail_span(span, exc)


def withdrawn_span(span: trace.Span) -> None:
    """Withdrawn while queued: no dispatcher saw it, so this span is its history row."""
    span.set_attributes(
        {
            semconv.STATUS: "dropped",
            semconv.DROP_REASON: Cancelled.error_type,
            semconv.ERROR_TYPE: Cancelled.error_type,
        }
    )
    span.set_status(trace.Status(trace.StatusCode.ERROR, "withdrawn by its caller while queued"))


def fail_span(span: trace.Span, exc: DispatchError) -> None:
    span.set_attribute(semconv.ERROR_TYPE, exc.error_type)
    span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
