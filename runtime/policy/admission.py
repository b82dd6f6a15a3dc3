"""Admission control at submit: may one more request join a pool's queue?

Pure: :func:`decide` takes the pool's queue depth, its limits and its recent drain rate (requests
per second that left the queue over the last :data:`DRAIN_WINDOW_S` seconds) and returns ``None``
(admit) or a :class:`Refusal`. The producer's admission-and-push script
(:mod:`runtime.queue.admission`) applies the same rule inside Valkey, atomically with the push;
this module is the rule's reference and builds the refusal's details (limit, retry-after hint).

    depth >= max_queued                        -> refused, reason "max_queued"
    with max_queue_wait_s, a pool that drains nothing has an unbounded wait:
      paused                                   -> refused, reason "paused"
      its backend's shared breaker open        -> refused, reason "breaker_open"
      backlog, nothing left for > that wait    -> refused, reason "not_draining"
    depth / drain_rate > max_queue_wait_s      -> refused, reason "max_queue_wait"

An ingress key's own limits (:class:`KeyLimits`) are checked first, over the whole fleet:

    open requests of the key >= max_in_flight  -> refused, reason "key_max_in_flight"
    queued requests of the key >= max_queued   -> refused, reason "key_max_queued"

The estimated wait is refused only on evidence: with no drain measured yet (a pool that was idle,
or whose dispatchers just started) there is no estimate, and only ``max_queued`` applies, until the
backlog has waited longer than ``max_queue_wait_s`` without one request leaving (dispatchers down or
stuck): the queue would then grow without bound, and it is refused.
"""

from __future__ import annotations

import math

from runtime.immutable import immutable

__all__ = [
    "DRAIN_WINDOW_S",
    "REASON_BREAKER_OPEN",
    "REASON_KEY_IN_FLIGHT",
    "REASON_KEY_QUEUED",
    "REASON_MAX_QUEUED",
    "REASON_MAX_QUEUE_WAIT",
    "REASON_NOT_DRAINING",
    "REASON_PAUSED",
    "AdmissionLimits",
    "KeyLimits",
    "Refusal",
    "Stall",
    "decide",
    "decide_key",
    "refusal",
]

REASON_MAX_QUEUED = "max_queued"
REASON_MAX_QUEUE_WAIT = "max_queue_wait"
# A pool that drains nothing: its estimated wait is unbounded.
REASON_PAUSED = "paused"
REASON_BREAKER_OPEN = "breaker_open"
REASON_NOT_DRAINING = "not_draining"
UNBOUNDED_REASONS = (REASON_PAUSED, REASON_BREAKER_OPEN, REASON_NOT_DRAINING)
REASON_KEY_IN_FLIGHT = "key_max_in_flight"
REASON_KEY_QUEUED = "key_max_queued"
# A refused key waits for one of its requests to end: no drain rate tells when, so a fixed hint.
KEY_RETRY_AFTER_S = 1.0
# The drain rate is measured over this many whole seconds before the current one.
DRAIN_WINDOW_S = 10
# Retry-after hints stay within these bounds: a hint of 0 invites a hot loop, hours help nobody.
RETRY_AFTER_MIN_S = 0.5
RETRY_AFTER_MAX_S = 300.0


@immutable
class AdmissionLimits:
    """A pool's admission limits; None means unbounded."""

    max_queued: int | None = None
    max_queue_wait_s: float | None = None
    # What the configuration says of the pool's drain (read with the limits): paused, and the backend
    # whose shared breaker state the script reads ("" for none) with that breaker's open time.
    paused: bool = False
    breaker_backend_id: str = ""
    breaker_open_s: float = 0.0

    def __post_init__(self) -> None:
        if self.max_queued is not None and self.max_queued < 1:
            raise ValueError(f"max_queued must be at least 1 (or None), got {self.max_queued}")
        if self.max_queue_wait_s is not None and self.max_queue_wait_s <= 0:
            raise ValueError(f"max_queue_wait_s must be positive (or None), got {self.max_queue_wait_s}")

    @property
    def bounded(self) -> bool:
        return self.max_queued is not None or self.max_queue_wait_s is not None


@immutable
class Stall:
    """Why a pool may drain nothing now: paused, its breaker open, or how long its backlog has waited
    without one request leaving the queue (0 without backlog)."""

    paused: bool = False
    breaker_open: bool = False
    idle_s: float = 0.0

    def reason(self, depth: int, max_wait: float) -> str | None:
        """The unbounded-wait reason, if any (the Valkey script checks in the same order)."""
        if self.paused:
            return REASON_PAUSED
        if self.breaker_open:
            return REASON_BREAKER_OPEN
        if depth > 0 and self.idle_s > max_wait:
            return REASON_NOT_DRAINING
        return None


@immutable
class KeyLimits:
    """An ingress key's limits over every web process; None means unbounded.

    ``max_in_flight`` counts the key's open requests (queued or running), ``max_queued`` those not
    yet started (waiting in a list, or for a retry).
    """

    key_id: str
    name: str
    max_in_flight: int | None = None
    max_queued: int | None = None

    @property
    def bounded(self) -> bool:
        return self.max_in_flight is not None or self.max_queued is not None

    def limit(self, reason: str) -> int:
        return (self.max_in_flight if reason == REASON_KEY_IN_FLIGHT else self.max_queued) or 0

    def describe(self, reason: str, count: int) -> str:
        if reason == REASON_KEY_IN_FLIGHT:
            return (
                f"key {self.name!r} has {count} requests open, its most in flight (max_in_flight) is "
                f"{self.limit(reason)}; retry when one has finished"
            )
        return (
            f"key {self.name!r} has {count} requests queued, its most queued (max_queued) is "
            f"{self.limit(reason)}; retry when one has started"
        )


def decide_key(open_count: int, queued_count: int, limits: KeyLimits) -> str | None:
    """None to admit; else the reason the key's own limits refuse one more request."""
    if limits.max_in_flight is not None and open_count >= limits.max_in_flight:
        return REASON_KEY_IN_FLIGHT
    if limits.max_queued is not None and queued_count >= limits.max_queued:
        return REASON_KEY_QUEUED
    return None


@immutable
class Refusal:
    """Why a submit was refused: the reason, the depth seen, the limit hit and a retry-after hint."""

    reason: str
    depth: int
    limit: float
    retry_after_s: float
    estimated_wait_s: float | None = None  # math.inf: unbounded (the pool drains nothing)
    idle_s: float = 0.0

    def describe(self, pool_id: str) -> str:
        if self.reason in UNBOUNDED_REASONS:
            why = {
                REASON_PAUSED: "is paused",
                REASON_BREAKER_OPEN: "has its backend's circuit breaker open",
                REASON_NOT_DRAINING: f"has drained nothing for {self.idle_s:.0f}s",
            }[self.reason]
            return (
                f"pool {pool_id!r} {why}: nothing leaves its queue ({self.depth} queued), so the wait is "
                f"unbounded, over its max_queue_wait_s of {self.limit:g}s; "
                f"retry in about {self.retry_after_s:.1f}s"
            )
        if self.reason == REASON_MAX_QUEUED:
            return (
                f"pool {pool_id!r} is full: {self.depth} requests queued, max_queued is {self.limit:g}; "
                f"retry in about {self.retry_after_s:.1f}s"
            )
        return (
            f"pool {pool_id!r} would make this request wait about {self.estimated_wait_s or 0:.1f}s "
            f"({self.depth} queued), over its max_queue_wait_s of {self.limit:g}s; "
            f"retry in about {self.retry_after_s:.1f}s"
        )


def estimated_wait_s(depth: int, drain_rate: float) -> float | None:
    """Seconds until a request behind ``depth`` others leaves the queue; None without a measured rate."""
    if depth <= 0:
        return 0.0
    if drain_rate <= 0:
        return None
    return depth / drain_rate


def decide(depth: int, limits: AdmissionLimits, drain_rate: float, stall: Stall = Stall()) -> Refusal | None:
    """None to admit the request; the refusal otherwise."""
    if limits.max_queued is not None and depth >= limits.max_queued:
        return refusal(REASON_MAX_QUEUED, depth, limits, drain_rate)
    if limits.max_queue_wait_s is not None:
        unbounded = stall.reason(depth, limits.max_queue_wait_s)
        if unbounded is not None:
            return refusal(unbounded, depth, limits, drain_rate, idle_s=stall.idle_s)
    wait = estimated_wait_s(depth, drain_rate)
    if limits.max_queue_wait_s is not None and wait is not None and wait > limits.max_queue_wait_s:
        return refusal(REASON_MAX_QUEUE_WAIT, depth, limits, drain_rate)
    return None


def refusal(
    reason: str, depth: int, limits: AdmissionLimits, drain_rate: float, *, idle_s: float = 0.0
) -> Refusal:
    """The refusal's details for a ``reason`` (also used for the verdict of the Valkey script)."""
    wait = estimated_wait_s(depth, drain_rate)
    if reason in UNBOUNDED_REASONS:
        # No estimate of when it drains again: come back after the longest wait the pool accepts.
        limit = float(limits.max_queue_wait_s or 0)
        retry = min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, limit))
        return Refusal(reason, depth, limit, retry, estimated_wait_s=math.inf, idle_s=idle_s)
    if reason == REASON_MAX_QUEUED:
        limit = float(limits.max_queued or 0)
        # Room for one more once (depth - max_queued + 1) requests have left the queue.
        excess = depth - limit + 1
        retry = excess / drain_rate if drain_rate > 0 else 1.0
    else:
        limit = float(limits.max_queue_wait_s or 0)
        retry = (wait or 0.0) - limit if drain_rate > 0 else 1.0
    retry = min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, retry))
    return Refusal(reason=reason, depth=depth, limit=limit, retry_after_s=retry, estimated_wait_s=wait)
