"""The dispatcher's counters: what it completed, what failed by type, what it dropped and why."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# Drop reasons: every request that leaves a queue without a reply to a live producer is one of these.
DROP_MALFORMED = "malformed"
DROP_PRODUCER_GONE = "producer_gone"  # liveness key missing before execution: never executed
DROP_REPLY_PRODUCER_GONE = "reply_producer_gone"  # executed, but the producer left before the reply
DROP_EXPIRED = "expired"  # deadline passed while queued: never executed
DROP_REPLY_UNDELIVERED = "reply_undelivered"  # Valkey failed while publishing the reply
# A durable request's result from a dispatcher whose lease was taken away (fencing): discarded, since
# the request went back to its queue and runs (or ran) elsewhere.
DROP_STALE_ATTEMPT = "stale_attempt"
DROP_DUPLICATE = "duplicate"  # a copy of a request (same pool and request_id) that is already running
DROP_LOST_IN_FLIGHT = "lost_in_flight"  # claimed by a dispatcher that died: its lease expired unreleased
DROP_REASONS = (
    DROP_MALFORMED,
    DROP_PRODUCER_GONE,
    DROP_REPLY_PRODUCER_GONE,
    DROP_EXPIRED,
    DROP_REPLY_UNDELIVERED,
    DROP_STALE_ATTEMPT,
    DROP_DUPLICATE,
    DROP_LOST_IN_FLIGHT,
)


@dataclass(slots=True)
class DispatcherStats:
    completed: int = 0
    failed: Counter[str] = field(default_factory=Counter)  # by error_type
    dropped: Counter[str] = field(default_factory=Counter)  # by drop reason
    skips: Counter[tuple[str, str]] = field(default_factory=Counter)  # (pool_id, reason)
    launched_by_pool: Counter[str] = field(default_factory=Counter)
    cost_by_pool: Counter[str] = field(default_factory=Counter)
    valkey_outages: int = 0
    claim_lost: int = 0  # peeked item taken by someone else before our claim
    turn_busy: int = 0  # rounds skipped because another dispatcher of the group was deciding
    stale_tokens: int = 0  # a wake token's request was no longer its list's head (taken meanwhile)
    ticket_claims: int = 0  # calls a push claimed against this dispatcher's ticket (runtime.dispatch.tickets)
    tickets_given_back: int = 0  # ... that it did not run: back at the head of their list
    claims_given_back: int = 0  # claims run after their answers were lost, undone (runtime.queue.unanswered)
    retried: int = 0  # failed attempts put in the delayed set for another attempt
    requeued: int = 0  # durable requests put back at the head of their list after a lease expired
    dead_lettered: int = 0  # requests moved to their pool's dead-letter list
    lost_by_pool: Counter[str] = field(default_factory=Counter)  # lost_in_flight, per pool
    internal_errors: int = 0  # unexpected exceptions caught by the scheduling round's guard
    config_rejected: int = 0  # published configurations this dispatcher refused
    rounds: int = 0  # scheduling rounds run (a spinning loop shows here)
    _flushed: Counter[str] = field(default_factory=Counter)

    def totals(self) -> dict[str, int]:
        """Flat cumulative counters, as stored in the group's Valkey counter hash."""
        flat: dict[str, int] = {
            "completed": self.completed,
            "valkey_outages": self.valkey_outages,
            "retried": self.retried,
            "requeued": self.requeued,
            "dead_lettered": self.dead_lettered,
            "internal_error": self.internal_errors,
            "config_rejected": self.config_rejected,
        }
        flat.update({f"failed:{k}": v for k, v in self.failed.items()})
        flat.update({f"dropped:{k}": v for k, v in self.dropped.items()})
        return flat

    def unflushed(self) -> dict[str, int]:
        """Increments since the last call, for HINCRBY into the shared counters."""
        totals = self.totals()
        deltas = {k: v - self._flushed[k] for k, v in totals.items() if v != self._flushed[k]}
        self._flushed.update(deltas)
        return deltas

    def restore(self, deltas: dict[str, int]) -> None:
        """Marks increments as not flushed again, after the write that carried them failed."""
        self._flushed.subtract(deltas)
