"""Every request that leaves a queue without being executed is counted by reason and written to history.

One place for the dispatcher's drops: malformed items (counted and logged: there is no request to
write a span for), refused claims (``producer_gone``, ``duplicate``), expired deadlines, and calls
lost in flight (read back from the lease records of a dead dispatcher's expired leases).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable

from opentelemetry import trace

from runtime.dispatch.stats import (
    DROP_DUPLICATE,
    DROP_EXPIRED,
    DROP_LOST_IN_FLIGHT,
    DROP_MALFORMED,
    DROP_PRODUCER_GONE,
    DispatcherStats,
)
from runtime.errors import ProducerGone, RequestExpired
from runtime.queue.leases import LeaseRecord
from runtime.telemetry.spans import Identity, Outcome, record_span
from runtime.wire.contract import STATUS_ERROR, Envelope, Reply, Timing

log = logging.getLogger(__name__)

# Why each drop happened, as the span's error message says it (history shows it to the operator).
DROP_MESSAGES = {
    DROP_EXPIRED: "deadline passed before the request left its queue",
    DROP_PRODUCER_GONE: "the producer was gone before the request could run",
    DROP_DUPLICATE: "a copy of this request (same pool and request id) was already running",
    DROP_LOST_IN_FLIGHT: "its dispatcher stopped renewing the lease (it died) before the call finished",
}

# The error a drop's producer was told of, by the drop's reason (history shows the same type).
DROP_ERROR_TYPES = {DROP_EXPIRED: RequestExpired.error_type, DROP_PRODUCER_GONE: ProducerGone.error_type}


def gone_reply(envelope: Envelope, now: float) -> bytes:
    """The error reply of a call dropped as producer_gone: the producer, if it is alive after all (its
    marker lapsed for a moment), fails its caller with :class:`ProducerGone` instead of a timeout."""
    error = ProducerGone(
        f"request {envelope.request_id} was not run: its producer's liveness marker had lapsed when a "
        "dispatcher took it off its queue; it never reached a backend and may be submitted again"
    )
    waited = max(0.0, now - envelope.enqueued_at)
    return Reply(
        envelope.request_id, STATUS_ERROR, error_type=error.error_type, error_message=str(error),
        timing=Timing(waited, 0.0, waited),
    ).encode()  # fmt: skip


class DropRecorder:
    def __init__(self, stats: DispatcherStats, tracer: trace.Tracer, identity: Identity) -> None:
        self.stats = stats
        self.tracer = tracer
        self.identity = identity

    def __repr__(self) -> str:
        return f"<DropRecorder dropped={dict(self.stats.dropped)}>"

    def malformed(self, pool_id: str, error: str) -> None:
        self.stats.dropped[DROP_MALFORMED] += 1
        log.warning("dropped a malformed item from pool %s: %s", pool_id, error)

    def dropped(self, envelope: Envelope, reason: str, *, cost: int = 0) -> None:
        """A request that was taken off its queue without running."""
        self.stats.dropped[reason] += 1
        now = time.time()
        outcome = Outcome(
            "dropped",
            now,
            now,
            drop_reason=reason,
            error_type=DROP_ERROR_TYPES.get(reason, ""),
            error_message=DROP_MESSAGES.get(reason, reason),
            cost=cost,
        )
        record_span(self.tracer, envelope, self.identity, outcome)

    def lost(self, records: Iterable[LeaseRecord]) -> None:
        """Calls whose lease expired unreleased: counted per pool, each written as a dropped span."""
        now = time.time()
        for record in records:
            self.stats.dropped[DROP_LOST_IN_FLIGHT] += 1
            self.stats.lost_by_pool[record.pool_id] += 1
            log.warning(
                "request %s of pool %s was lost in flight: dispatcher %s claimed it %.1fs ago and its "
                "lease expired without a reply",
                record.request_id,
                record.pool_id,
                record.dispatcher_id,
                now - record.claimed_at,
            )
            outcome = Outcome(
                "dropped",
                record.claimed_at,
                now,
                drop_reason=DROP_LOST_IN_FLIGHT,
                error_message=DROP_MESSAGES[DROP_LOST_IN_FLIGHT],
                cost=record.cost,
            )
            who = dataclasses.replace(self.identity, dispatcher_id=record.dispatcher_id)
            record_span(self.tracer, record.subject(), who, outcome)
