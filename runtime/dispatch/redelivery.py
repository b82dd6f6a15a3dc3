"""What happens to a request after an attempt fails, or after its dispatcher's lease expires.

:func:`settle` turns the end of one attempt into a :class:`Settlement`: reply to the producer, wait in
the pool's delayed set for another attempt, or become a dead letter. It decides nothing itself (the
pure :func:`runtime.policy.retry.decide` does); it builds what the finish script stores.

The delayed set ``zset:llm:delayed:{pool_id}`` holds each retry's next envelope scored by its due time;
``scripts.PROMOTE`` moves the due ones back to the head of the pool's list, so a retry never sleeps in
a running slot and is scheduled like any queued request: weights, caps and the breaker apply to it.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from runtime.dispatch.deadletters import ATTEMPTS_EXHAUSTED, REQUEUES_EXHAUSTED, DeadLetter
from runtime.dispatch.scripts import SETTLE_DEAD, SETTLE_RETRY
from runtime.errors import DeadLettered, DispatchError
from runtime.policy import retry
from runtime.wire.contract import STATUS_ERROR, Envelope, Reply, Timing

# Span statuses of attempts that did not end the request (besides ok, error, dropped).
STATUS_RETRY = "retry"
STATUS_REQUEUED = "requeued"


@dataclass(frozen=True, slots=True)
class Settlement:
    """How one finished attempt leaves Valkey: the reply, or the retry/dead letter stored with it."""

    kind: str  # SETTLE_REPLY | SETTLE_RETRY | SETTLE_DEAD
    reply: bytes = b""  # to the producer (empty for a retry: nobody is answered yet)
    payload: bytes = b""  # retry: the next attempt's envelope; dead: the dead letter
    due_at: float = 0.0  # retry: when the next attempt may run
    error: DispatchError | None = None  # what the span records (the dead letter's own error when dead)


def next_attempt(envelope: Envelope) -> Envelope:
    """The envelope of the request's next attempt after a failure."""
    return dataclasses.replace(envelope, attempt=envelope.attempt + 1)


def requeued(envelope: Envelope) -> Envelope:
    """The envelope a durable claim stores, queued again if the lease expires: one attempt and requeue on."""
    return dataclasses.replace(envelope, attempt=envelope.attempt + 1, requeues=envelope.requeues + 1)


def dead_letter_reply(letter: DeadLetter, timing: Timing) -> Reply:
    message = (
        f"request {letter.request_id} became a dead letter of pool {letter.pool_id} "
        f"({letter.reason} after {letter.attempts} attempt(s)); last error {letter.error_type}: "
        f"{letter.error_message}"
    )
    return Reply(
        letter.request_id,
        STATUS_ERROR,
        error_type=DeadLettered.error_type,
        error_message=message,
        timing=timing,
    )


def settle_failure(
    envelope: Envelope,
    error: DispatchError,
    policy: retry.RetryPolicy,
    *,
    now: float,
    timing: Timing,
    cut_by_deadline: bool = False,
    rng: random.Random | None = None,
) -> Settlement | None:
    """A retry or a dead letter for a failed attempt; None when the error simply goes back to the producer.

    Only pools that retry (``max_attempts`` > 1) dead-letter: with one attempt, a failure is answered
    as in phase 1. A streamed request never retries: its producer may already hold chunks.
    """
    if envelope.stream is not None or policy.max_attempts <= 1:
        return None
    jitter = (rng or random).random()
    decision = retry.decide(
        policy,
        retry.Failure.of(error, cut_by_deadline=cut_by_deadline),
        attempt=envelope.attempt,
        now=now,
        deadline=envelope.deadline,
        jitter=jitter,
    )
    if decision.retry:
        return Settlement(
            SETTLE_RETRY, payload=next_attempt(envelope).encode(), due_at=decision.due_at, error=error
        )
    if decision.reason != retry.ATTEMPTS_EXHAUSTED:
        return None
    return bury(envelope, reason=ATTEMPTS_EXHAUSTED, error=error, now=now, timing=timing)


def bury(
    envelope: Envelope, *, reason: str, error: DispatchError | None, now: float, timing: Timing
) -> Settlement:
    """A dead letter of ``envelope`` and the typed error its producer gets."""
    letter = DeadLetter.of(
        envelope,
        reason=reason,
        error_type=error.error_type if error else "lease_expired",
        error_message=str(error) if error else "its dispatcher's lease expired on every attempt",
        now=now,
    )
    reply = dead_letter_reply(letter, timing)
    return Settlement(
        SETTLE_DEAD,
        reply=reply.encode(),
        payload=letter.encode(),
        error=DeadLettered(reply.error_message or ""),
    )


def requeues_exhausted(envelope: Envelope, max_requeues: int) -> bool:
    """A durable request put back more often than its pool allows: dead-lettered instead of run."""
    return envelope.requeues > max_requeues


__all__ = [
    "REQUEUES_EXHAUSTED",
    "STATUS_REQUEUED",
    "STATUS_RETRY",
    "Settlement",
    "bury",
    "next_attempt",
    "requeued",
    "requeues_exhausted",
    "settle_failure",
]
