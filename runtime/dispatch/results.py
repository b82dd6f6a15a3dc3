"""What a finished call leaves behind: the reply its producer gets, the dispatcher's counters and the
outcome its span records. Pure: :class:`runtime.dispatch.execution.Executor` runs the call and
finishes it, then hands what happened to these functions.
"""

from __future__ import annotations

import functools

from runtime.backends.adapter import Completion
from runtime.backends.redact import redact_url
from runtime.dispatch import redelivery
from runtime.dispatch.stats import (
    DROP_REPLY_PRODUCER_GONE,
    DROP_REPLY_UNDELIVERED,
    DROP_STALE_ATTEMPT,
    DispatcherStats,
)
from runtime.dispatch.streaming import ProducerGoneMidStream, StreamSummary
from runtime.errors import BackendHTTPError, DeadLettered, DispatchError, Rejected, StreamInterrupted
from runtime.queue import scripts
from runtime.telemetry.spans import Outcome
from runtime.wire.contract import STATUS_ERROR, STATUS_OK, BackendAnswer, Envelope, Reply, Timing

__all__ = [
    "FINISH_UNDELIVERED",
    "backend_answer",
    "count_finish",
    "cut_by_shutdown",
    "cut_stream_reply",
    "reply_bytes",
    "span_outcome",
]

FINISH_UNDELIVERED = -2  # Valkey failed on every try: the reply (or retry) is lost, and counted
# Endpoints are few and their redacted form never changes: parse each once, not once per call.
_shown_url = functools.lru_cache(maxsize=64)(redact_url)


def cut_by_shutdown(
    envelope: Envelope, token: str, summary: StreamSummary | None
) -> tuple[DispatchError, redelivery.Settlement | None]:
    """A call still running when the grace period ended: a durable one (fenced by ``token``) goes back
    to the head of its pool (nothing of it reached the producer yet); a stream that did send chunks
    ends as ``stream_interrupted``; any other is answered ``rejected``."""
    request_id = envelope.request_id
    if summary is not None and summary.relayed:
        return StreamInterrupted(
            f"request {request_id}: the dispatcher shut down after {summary.relayed} chunk(s) were sent"
        ), None
    if token:
        error = Rejected(
            f"request {request_id}: the dispatcher shut down before the call finished; queued again"
        )
        payload = redelivery.requeued(envelope).encode()
        return error, redelivery.Settlement(scripts.SETTLE_REQUEUE, payload=payload, error=error)
    return Rejected("the dispatcher shut down before the call finished"), None


def count_finish(
    stats: DispatcherStats, code: int, error: DispatchError | None, settled: redelivery.Settlement | None
) -> None:
    """Counts how a finished call ended in ``stats``."""
    if code == scripts.FINISH_STALE:
        stats.dropped[DROP_STALE_ATTEMPT] += 1
        return
    if code == scripts.FINISH_PRODUCER_GONE:
        stats.dropped[DROP_REPLY_PRODUCER_GONE] += 1
    if code == FINISH_UNDELIVERED:
        stats.dropped[DROP_REPLY_UNDELIVERED] += 1
    if settled is not None and settled.kind == scripts.SETTLE_RETRY:
        stats.retried += 1
    elif settled is not None and settled.kind == scripts.SETTLE_REQUEUE:
        stats.requeued += 1
    elif settled is not None:
        stats.dead_lettered += 1
        stats.failed[DeadLettered.error_type] += 1
    elif error is None:
        stats.completed += 1
    else:
        stats.failed[error.error_type] += 1


def reply_bytes(
    envelope: Envelope, completion: Completion | None, error: DispatchError | None, timing: Timing
) -> bytes:
    """The encoded reply for the producer: the completion, or the error (with what the backend said)."""
    if error is None and completion is not None:
        return Reply(envelope.request_id, STATUS_OK, completion=completion.body, timing=timing).encode()
    assert error is not None
    return Reply(
        envelope.request_id,
        STATUS_ERROR,
        error_type=error.error_type,
        error_message=str(error),
        timing=timing,
        backend=backend_answer(error),
    ).encode()


def cut_stream_reply(envelope: Envelope, summary: StreamSummary | None, timing: Timing) -> bytes:
    """The error reply of a stream cut off because its producer's liveness marker lapsed mid-stream
    (``stream_producer_gone``), for a producer alive after all; names no producer or host."""
    relayed = summary.relayed if summary is not None else 0
    return Reply(
        envelope.request_id,
        STATUS_ERROR,
        error_type=ProducerGoneMidStream.error_type,
        error_message=(
            f"the stream was cut off after {relayed} chunk(s): its producer's liveness marker had lapsed, "
            "so the dispatcher stopped the backend call; the chunks already received stand"
        ),
        timing=timing,
    ).encode()


def backend_answer(error: DispatchError) -> BackendAnswer | None:
    """What the backend answered, for the reply: its status, Retry-After and own message."""
    if not isinstance(error, BackendHTTPError):
        return None
    return BackendAnswer(error.status_code, error.backend_message, error.retry_after_s)


def span_outcome(
    envelope: Envelope,
    cost: int,
    endpoint: str,
    completion: Completion | None,
    error: DispatchError | None,
    started: float,
    ended: float,
    code: int,
    summary: StreamSummary | None = None,
    settled: redelivery.Settlement | None = None,
) -> Outcome:
    """The outcome a call's span records: its status, why it was dropped, what the backend used."""
    usage = completion.usage if completion is not None else None
    first_chunk_at = summary.first_chunk_at if summary is not None else None
    status, drop_reason = STATUS_OK if error is None else STATUS_ERROR, ""
    if code == scripts.FINISH_STALE:
        status, drop_reason = "dropped", DROP_STALE_ATTEMPT
    elif settled is not None and settled.kind == scripts.SETTLE_RETRY:
        status = redelivery.STATUS_RETRY
    elif settled is not None and settled.kind == scripts.SETTLE_REQUEUE:
        status, drop_reason = redelivery.STATUS_REQUEUED, "shutdown"
    elif code == scripts.FINISH_PRODUCER_GONE:
        drop_reason = DROP_REPLY_PRODUCER_GONE
    elif code == FINISH_UNDELIVERED:
        drop_reason = DROP_REPLY_UNDELIVERED
    shown = settled.error if settled is not None and settled.kind == scripts.SETTLE_DEAD else error
    return Outcome(
        status,
        started,
        ended,
        backend_url=_shown_url(endpoint),
        error_type=shown.error_type if shown else "",
        error_message=str(shown) if shown else "",
        input_tokens=usage.input_tokens if usage else None,
        output_tokens=usage.output_tokens if usage else None,
        response_model=completion.model if completion else None,
        reply_delivered=code == scripts.FINISH_DELIVERED,
        cost=cost,
        drop_reason=drop_reason,
        time_to_first_token_s=first_chunk_at - started if first_chunk_at is not None else None,
        chunk_count=summary.chunks if summary is not None else None,
        attempt=envelope.attempt,
    )
