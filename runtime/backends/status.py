"""A backend's live status in plain words, for the admin, the dashboard and ``/metrics``.

Pure apart from :func:`queue_reads`, which only queues commands on a pipeline the caller owns (sync
or async), so the Django side and the runtime read the same three keys the same way: the shared
load, the shared breaker state and the fleet's in-flight leases to the backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.backends.breaker import CLOSED, HALF_OPEN, Breaker, BreakerState, decode_state
from runtime.backends.gate import METRICS_FRESH, METRICS_NONE, METRICS_STALE, gate
from runtime.backends.metrics import BackendLoad
from runtime.errors import MalformedEnvelope
from runtime.wire.backendconfig import BackendConfig
from runtime.wire.keys import KeySpace

__all__ = ["BREAKER_WORDS", "BackendStatus", "backend_status", "queue_reads", "status_from_replies"]

# The dashboard's words for breaker modes (see README "Reading the dashboard").
BREAKER_WORDS = {CLOSED: "healthy", "open": "failing (calls held)", HALF_OPEN: "probing"}


@dataclass(frozen=True, slots=True)
class BackendStatus:
    backend_id: str
    name: str
    kind: str
    max_in_flight: int
    in_flight: int  # ours, across the fleet
    limit: int  # what the gate allows in flight now
    held: str  # "" while there is room, else the skip reason (backend_saturated / backend_cap)
    metrics: str  # fresh / stale / unreachable / none
    metrics_age_s: float | None
    running: int | None
    waiting: int | None
    kv_usage: float | None
    scrape_error: str
    breaker: str  # closed / open / half_open
    breaker_trips: int

    @property
    def breaker_words(self) -> str:
        return BREAKER_WORDS.get(self.breaker, self.breaker)

    def metrics_words(self) -> str:
        if self.metrics == METRICS_NONE:
            return "no load metrics (max in flight only)"
        if self.metrics == METRICS_FRESH:
            return f"metrics {self.metrics_age_s or 0:.1f}s old"
        if self.metrics == METRICS_STALE:
            return f"metrics stale ({self.metrics_age_s or 0:.1f}s old): max in flight only"
        why = f": {self.scrape_error}" if self.scrape_error else ""
        return f"metrics unreachable{why}: max in flight only"

    def describe(self) -> str:
        """One line for the admin's list and form."""
        parts = [f"{self.in_flight}/{self.max_in_flight} in flight from us"]
        if self.running is not None:
            parts.append(
                f"running {self.running}, waiting {self.waiting}, KV {100 * (self.kv_usage or 0):.0f}%"
            )
        parts.append(self.metrics_words())
        parts.append(f"breaker {self.breaker_words}")
        if self.held:
            parts.append(f"held: {self.held}")
        return "; ".join(parts)


def queue_reads(pipe: Any, keys: KeySpace, backend_id: str, now: float) -> None:
    """Queues the three reads :func:`status_from_replies` takes, in this order."""
    pipe.get(keys.backend_load(backend_id))
    pipe.get(keys.backend_breaker(backend_id))
    pipe.zcount(keys.backend_inflight(backend_id), f"({now}", "+inf")


def status_from_replies(config: BackendConfig, replies: list[Any], now: float) -> BackendStatus:
    """The status from the replies of :func:`queue_reads` (three of them)."""
    raw_load, raw_breaker, in_flight = replies
    load = None
    if raw_load:
        try:
            load = BackendLoad.decode(raw_load)
        except MalformedEnvelope:
            load = None
    try:
        breaker = decode_state(raw_breaker)
    except ValueError:
        breaker = BreakerState()
    return backend_status(config, load, int(in_flight or 0), breaker, now)


def backend_status(
    config: BackendConfig, load: BackendLoad | None, in_flight: int, breaker: BreakerState, now: float
) -> BackendStatus:
    decision = gate(config.gate_settings(), load, in_flight=in_flight, now=now)
    mode = breaker.mode
    if mode != CLOSED and Breaker(config.breaker_policy()).blocked(breaker, now) is None:
        mode = HALF_OPEN  # open time over: the next call is a probe
    shown = load if load is not None and load.ok and config.scrapes else None
    return BackendStatus(
        backend_id=config.backend_id,
        name=config.name or config.backend_id,
        kind=config.kind,
        max_in_flight=config.max_in_flight,
        in_flight=in_flight,
        limit=decision.limit,
        held=decision.reason or "",
        metrics=decision.metrics,
        metrics_age_s=decision.age_s,
        running=shown.running if shown else None,
        waiting=shown.waiting if shown else None,
        kv_usage=shown.kv_usage if shown else None,
        scrape_error=load.error if load is not None else "",
        breaker=mode,
        breaker_trips=breaker.trips,
    )
