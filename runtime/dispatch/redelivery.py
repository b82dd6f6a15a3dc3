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
import time
from collections.abc import Awaitable, Callable, Iterable

from opentelemetry import trace

from runtime.dispatch.deadletters import ATTEMPTS_EXHAUSTED, REQUEUES_EXHAUSTED, DeadLetter
from runtime.dispatch.stats import DROP_REPLY_PRODUCER_GONE, DispatcherStats
from runtime.errors import DeadLettered, DispatchError, StreamInterrupted
from runtime.immutable import immutable
from runtime.policy import retry
from runtime.queue.dispatching import QueueOps
from runtime.queue.leases import LeaseRecord
from runtime.queue.scripts import SETTLE_DEAD, SETTLE_RETRY
from runtime.telemetry.spans import Identity, Outcome, record_span
from runtime.wire.contract import STATUS_ERROR, Envelope, Reply, Timing
from runtime.wire.groupconfig import GroupConfig

# Span statuses of attempts that did not end the request (besides ok, error, dropped).
STATUS_RETRY = "retry"
STATUS_REQUEUED = "requeued"
# Pools that do not retry (any more) are searched for due retries this often, not on every promotion.
SWEEP_S = 1.0


@immutable
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


class Redeliveries:
    """The dispatcher's side of durable delivery and retries: it counts and records the requeues its
    reaps made, buries requests requeued too often, and moves due retries back into their lists."""

    def __init__(
        self,
        queue: QueueOps,
        stats: DispatcherStats,
        tracer: trace.Tracer,
        identity: Identity,
        reply_ttl_s: float,
    ) -> None:
        self.queue = queue
        self.stats = stats
        self.tracer = tracer
        self.identity = identity
        self.reply_ttl_s = reply_ttl_s
        self._swept_at = float("-inf")

    def __repr__(self) -> str:
        return (
            f"<Redeliveries retried={self.stats.retried} requeued={self.stats.requeued} "
            f"dead_lettered={self.stats.dead_lettered}>"
        )

    def requeued(self, envelopes: Iterable[bytes]) -> None:
        """Durable requests REAP put back after their dispatcher's lease expired: counted, and a span each."""
        now = time.time()
        for raw in envelopes:
            self.stats.requeued += 1
            try:
                envelope = Envelope.decode(raw)
            except DispatchError:
                continue  # stored by this code at claim time: only a foreign writer could make this
            outcome = Outcome(
                STATUS_REQUEUED, now, now, drop_reason="lease_expired", attempt=envelope.attempt - 1,
                error_message="its dispatcher's lease expired before the call finished: queued again",
            )  # fmt: skip
            record_span(self.tracer, envelope, self.identity, outcome)

    async def interrupted(
        self, records: Iterable[LeaseRecord], answer: Callable[[str, bytes], Awaitable[bool]]
    ) -> None:
        """Durable streams whose dispatcher died after chunks reached their producer: never run again
        (a second attempt would repeat or mix chunks); ``answer`` sends each producer a typed
        ``stream_interrupted`` error. Counted as failures of that type, and a span each."""
        now = time.time()
        for record in records:
            error = StreamInterrupted(
                f"request {record.request_id}: its dispatcher stopped while it streamed, after chunks "
                "were sent; it is not run again"
            )
            timing = Timing(
                max(0.0, record.claimed_at - record.enqueued_at),
                max(0.0, now - record.claimed_at),
                max(0.0, now - record.enqueued_at),
            )
            reply = Reply(
                record.request_id, STATUS_ERROR, error_type=error.error_type, error_message=str(error),
                timing=timing,
            )  # fmt: skip
            delivered = await answer(record.producer_id, reply.encode())
            self.stats.failed[error.error_type] += 1
            if not delivered:
                self.stats.dropped[DROP_REPLY_PRODUCER_GONE] += 1
            outcome = Outcome(
                STATUS_ERROR, record.claimed_at, now, error_type=error.error_type, error_message=str(error),
                reply_delivered=delivered, cost=record.cost,
                drop_reason="" if delivered else DROP_REPLY_PRODUCER_GONE,
            )  # fmt: skip
            who = dataclasses.replace(self.identity, dispatcher_id=record.dispatcher_id)
            record_span(self.tracer, record.subject(), who, outcome)

    async def bury(self, pool_id: str, raw: bytes, envelope: Envelope) -> bool:
        """Dead-letters the head ``raw`` of a pool, requeued more often than the pool allows."""
        now = time.time()
        waited = max(0.0, now - envelope.enqueued_at)
        settled = bury(
            envelope, reason=REQUEUES_EXHAUSTED, error=None, now=now, timing=Timing(waited, 0.0, waited)
        )
        buried = await self.queue.bury(
            raw,
            pool_id=pool_id,
            producer_id=envelope.producer_id,
            letter=settled.payload,
            reply=settled.reply,
            reply_ttl_s=self.reply_ttl_s,
        )
        if buried:
            self.stats.dead_lettered += 1
            self.stats.failed[DeadLettered.error_type] += 1
            error = settled.error or DeadLettered()
            outcome = Outcome(
                STATUS_ERROR,
                now,
                now,
                error_type=error.error_type,
                error_message=str(error),
                attempt=envelope.attempt,
            )
            record_span(self.tracer, envelope, self.identity, outcome)
        return buried

    async def promote(self, config: GroupConfig | None) -> int:
        """Moves due retries of the group's retrying pools back to their lists; every
        :data:`SWEEP_S` those of every enabled pool too: retries wait on in a pool whose
        ``max_attempts`` was lowered to 1 meanwhile, and must not be stranded there."""
        if config is None:
            return 0
        sweep = time.monotonic() - self._swept_at >= SWEEP_S
        if sweep:
            self._swept_at = time.monotonic()
        pools = [p.pool_id for p in config.enabled_pools if sweep or p.max_attempts > 1]
        return await self.queue.promote(pools) if pools else 0

    def exhausted(self, config: GroupConfig | None, envelope: Envelope) -> bool:
        """A durable request put back more often than its pool allows: dead-lettered instead of run."""
        pool = config.pool(envelope.pool_id) if config is not None else None
        return pool is not None and requeues_exhausted(envelope, pool.max_requeues)


__all__ = [
    "REQUEUES_EXHAUSTED",
    "STATUS_REQUEUED",
    "STATUS_RETRY",
    "Redeliveries",
    "Settlement",
    "bury",
    "next_attempt",
    "requeued",
    "requeues_exhausted",
    "settle_failure",
]
