"""A backend's live status in plain words, for the admin, the dashboard and ``/metrics``.

Pure apart from :func:`queue_reads`, which only queues commands on a pipeline the caller owns (sync
or async), so the Django side and the runtime read the same keys the same way (:data:`READS` of them):
the shared load, the shared breaker state, the fleet's in-flight leases to the backend and what is left
of a 429's Retry-After hold.
"""

from __future__ import annotations

from typing import Any

from runtime.backends.breaker import CLOSED, HALF_OPEN, Breaker, BreakerState, decode_state
from runtime.backends.gate import METRICS_FRESH, METRICS_NONE, METRICS_REFUSED, METRICS_STALE, gate
from runtime.backends.metrics import METRIC_NAMES, BackendLoad, load_problem
from runtime.errors import MalformedEnvelope
from runtime.immutable import immutable
from runtime.queue.keys import KeySpace
from runtime.wire.backendconfig import BackendConfig

__all__ = [
    "BREAKER_WORDS",
    "READS",
    "BackendStatus",
    "backend_status",
    "queue_reads",
    "status_from_replies",
]

# Replies per backend of queue_reads, in order: load, breaker, in-flight count, hold PTTL.
READS = 4

# The dashboard's words for breaker modes (see README "Reading the dashboard").
BREAKER_WORDS = {CLOSED: "healthy", "open": "failing (calls held)", HALF_OPEN: "probing"}


@immutable
class BackendStatus:
    backend_id: str
    name: str
    kind: str
    max_in_flight: int
    in_flight: int  # ours, across the fleet
    limit: int  # what the gate allows in flight now
    held: str  # "" while there is room, else the skip reason (backend_saturated / _cap / _retry_after)
    metrics: str  # fresh / stale / unreachable / refused / none
    metrics_age_s: float | None
    running: int | None
    waiting: int | None
    kv_usage: float | None
    scrape_error: str  # why the metrics are unreachable or refused
    breaker: str  # closed / open / half_open
    breaker_trips: int
    kv_metric: str = ""  # the gauge the KV-cache usage was read from
    hold_s: float = 0.0  # what is left of the backend's last 429 Retry-After

    @property
    def kv_metric_note(self) -> str:
        """Names the KV-cache gauge read when it is not the kind's current one (an older server)."""
        names = METRIC_NAMES.get(self.kind)
        if not self.kv_metric or names is None or self.kv_metric in names.kv_usage[:1]:
            return ""
        return f"KV-cache usage read from {self.kv_metric} (older server)"

    @property
    def breaker_words(self) -> str:
        return BREAKER_WORDS.get(self.breaker, self.breaker)

    def metrics_words(self) -> str:
        if self.metrics == METRICS_NONE:
            return "no load metrics (max in flight and a 429's Retry-After only)"
        note = f" ({self.kv_metric_note})" if self.kv_metric_note else ""
        if self.metrics == METRICS_FRESH:
            return f"metrics {self.metrics_age_s or 0:.1f}s old{note}"
        if self.metrics == METRICS_STALE:
            return f"metrics stale ({self.metrics_age_s or 0:.1f}s old){note}: max in flight only"
        why = f": {self.scrape_error}" if self.scrape_error else ""
        word = "refused" if self.metrics == METRICS_REFUSED else "unreachable"
        return f"metrics {word}{why}: max in flight only"

    def hold_words(self) -> str:
        if not self.hold_s:
            return ""
        return f" (the backend answered 429 with Retry-After; {self.hold_s:.1f}s left)"

    def describe(self) -> str:
        """One line for the admin's list and form."""
        parts = [f"{self.in_flight}/{self.max_in_flight} in flight from us"]
        if self.running is not None:
            kv = f" ({self.kv_metric})" if self.kv_metric and not self.kv_metric_note else ""
            usage = "no KV gauge" if self.kv_usage is None else f"KV {100 * self.kv_usage:.0f}%{kv}"
            parts.append(f"running {self.running}, waiting {self.waiting}, {usage}")
        parts.append(self.metrics_words())
        parts.append(f"breaker {self.breaker_words}")
        if self.held:
            parts.append(f"held: {self.held}{self.hold_words()}")
        return "; ".join(parts)


def queue_reads(pipe: Any, keys: KeySpace, backend_id: str, now: float) -> None:
    """Queues the :data:`READS` reads :func:`status_from_replies` takes, in this order."""
    pipe.get(keys.backend_load(backend_id))
    pipe.get(keys.backend_breaker(backend_id))
    pipe.zcount(keys.backend_inflight(backend_id), f"({now}", "+inf")
    pipe.pttl(keys.backend_hold(backend_id))


def status_from_replies(config: BackendConfig, replies: list[Any], now: float) -> BackendStatus:
    """The status from the replies of :func:`queue_reads` (:data:`READS` of them)."""
    raw_load, raw_breaker, in_flight, hold_pttl = replies
    load = None
    if raw_load:
        try:
            load = BackendLoad.decode(raw_load)
        except MalformedEnvelope as exc:  # refused, and said why, like a bad value
            load = BackendLoad(config.backend_id, now, error=str(exc), refused=True)
    try:
        breaker = decode_state(raw_breaker)
    except ValueError:
        breaker = BreakerState()
    # PTTL: -2 without a hold, -1 for a key without expiry (not ours: ignored rather than held forever).
    hold_s = hold_pttl / 1000 if isinstance(hold_pttl, int) and hold_pttl > 0 else 0.0
    return backend_status(config, load, int(in_flight or 0), breaker, now, hold_s=hold_s)


def backend_status(
    config: BackendConfig,
    load: BackendLoad | None,
    in_flight: int,
    breaker: BreakerState,
    now: float,
    *,
    hold_s: float = 0.0,
) -> BackendStatus:
    decision = gate(config.gate_settings(), load, in_flight=in_flight, now=now, hold_s=hold_s)
    mode = breaker.mode
    if mode != CLOSED and Breaker(config.breaker_policy()).blocked(breaker, now) is None:
        mode = HALF_OPEN  # open time over: the next call is a probe
    problem = load_problem(load) if load is not None and load.ok else None
    shown = load if load is not None and load.ok and problem is None and config.scrapes else None
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
        kv_usage=shown.kv_usage if shown and shown.kv_exported else None,
        scrape_error=str(load.error or problem or "")[:300] if load is not None else "",
        breaker=mode,
        breaker_trips=breaker.trips,
        kv_metric=(shown.kv_metric or _current_kv_name(config.kind)) if shown and shown.kv_exported else "",
        hold_s=decision.hold_s,
    )


def _current_kv_name(kind: str) -> str:
    """The KV-cache gauge read when the shared load names none (the kind's current name)."""
    names = METRIC_NAMES.get(kind)
    return names.kv_usage[0] if names is not None and names.kv_usage else ""
