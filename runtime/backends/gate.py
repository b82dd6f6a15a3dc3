"""Backend-load gating: how many of our calls a backend may have in flight right now.

Pure, like the scheduler and the breaker: :func:`gate` takes the backend's settings, its last shared
load (:class:`~runtime.backends.metrics.BackendLoad`), how many calls the fleet has in flight to it
now and ``now`` (wall-clock seconds, as the load's ``scraped_at``), and returns a
:class:`GateDecision`. The dispatcher offers no head of a pool whose backend has no room, with the
decision's skip reason, and its CLAIM enforces the decision's ``limit`` fleet-wide and atomically.

Why a limit and not a yes/no: metrics arrive every ~250 ms, while a dispatcher can launch dozens of
calls in that time. Every call launched since the scrape is counted as already waiting in the
backend's own queue (``in_flight - in_flight_at_scrape``), so the fleet never pushes the backend's
waiting queue past ``max_waiting`` between two scrapes, and a full KV cache admits nothing new until
a scrape says it has room again.

    limit = max_in_flight                                        always
    limit = min(limit, in_flight_at_scrape + max_waiting - waiting)   fresh metrics
    limit = min(limit, in_flight_at_scrape)                      fresh metrics, KV cache over its limit

After a 429 with a ``Retry-After`` (any kind, and the only load signal of kind ``openai``), the fleet
holds the backend for that long (``hold_s``, at most :data:`RETRY_AFTER_HOLD_MAX_S`): limit 0, skip
reason ``backend_retry_after``.

Stale (older than ``metrics_max_age_s``), failed or refused scrapes fall back to ``max_in_flight``
alone, and the decision says so (``metrics`` is ``"stale"``, ``"unreachable"`` or ``"refused"``) for
the dashboard.

Total: the load comes from Valkey, so its fields may hold anything JSON can; a load that breaks
:func:`~runtime.backends.metrics.load_problem`'s rules is refused, never computed with.
"""

from __future__ import annotations

import math

from runtime.backends.metrics import BackendLoad, load_problem
from runtime.immutable import immutable
from runtime.wire.backendconfig import GateSettings

__all__ = [
    "METRICS_FRESH",
    "METRICS_NONE",
    "METRICS_REFUSED",
    "METRICS_STALE",
    "METRICS_UNREACHABLE",
    "RETRY_AFTER_HOLD_MAX_S",
    "SKIP_BACKEND_CAP",
    "SKIP_BACKEND_RETRY_AFTER",
    "SKIP_BACKEND_SATURATED",
    "GateDecision",
    "GateSettings",
    "gate",
    "hold_ms",
]

SKIP_BACKEND_SATURATED = "backend_saturated"  # the backend's own queue or KV cache is full
SKIP_BACKEND_CAP = "backend_cap"  # the backend's max_in_flight is reached across the fleet
SKIP_BACKEND_RETRY_AFTER = "backend_retry_after"  # the backend answered 429 and its Retry-After is not over

# A Retry-After longer than this holds the backend this long: the next call asks again. A hostile or
# confused backend (Retry-After: 10^9) then costs minutes, not forever.
RETRY_AFTER_HOLD_MAX_S = 300.0

METRICS_FRESH = "fresh"
METRICS_STALE = "stale"
METRICS_UNREACHABLE = "unreachable"
METRICS_REFUSED = "refused"  # the backend answered with metrics that cannot be used (the load says why)
METRICS_NONE = "none"  # kind "openai": the backend exports no load metrics


@immutable
class GateDecision:
    """``limit``: calls the fleet may have in flight to the backend now; ``reason``: the skip reason
    while ``in_flight`` has reached it (None while there is room); ``metrics``: how the load was known;
    ``age_s``: the age of the load used (None without one); ``hold_s``: what is left of a 429's
    Retry-After (0: none)."""

    limit: int
    reason: str | None
    metrics: str
    age_s: float | None = None
    hold_s: float = 0.0

    @property
    def room(self) -> bool:
        return self.reason is None


def hold_ms(retry_after_s: float | None) -> int:
    """How long (ms) a 429's Retry-After holds the backend fleet-wide: 0 for none, bounded above."""
    if retry_after_s is None or not math.isfinite(retry_after_s) or retry_after_s <= 0:
        return 0
    return math.ceil(1000 * min(retry_after_s, RETRY_AFTER_HOLD_MAX_S))


def gate(
    settings: GateSettings, load: BackendLoad | None, *, in_flight: int, now: float, hold_s: float = 0.0
) -> GateDecision:
    """The backend's in-flight limit now, and why nothing may launch when it is reached. ``hold_s``:
    what is left of the backend's last 429 Retry-After (nothing launches until it is over)."""
    cap = settings.max_in_flight
    status, age = metrics_status(settings, load, now)
    if hold_s > 0:
        reason = SKIP_BACKEND_RETRY_AFTER if in_flight >= 0 else None
        return GateDecision(limit=0, reason=reason, metrics=status, age_s=age, hold_s=hold_s)
    load_limit = cap
    if status == METRICS_FRESH and load is not None:
        load_limit = load.in_flight_at_scrape + settings.max_waiting - load.waiting
        if load.kv_usage >= settings.max_kv_cache_usage:
            load_limit = min(load_limit, load.in_flight_at_scrape)
        load_limit = max(0, load_limit)
    limit = min(cap, load_limit)
    reason = None
    if in_flight >= limit:
        reason = SKIP_BACKEND_SATURATED if load_limit < cap else SKIP_BACKEND_CAP
    return GateDecision(limit=limit, reason=reason, metrics=status, age_s=age)


def metrics_status(settings: GateSettings, load: BackendLoad | None, now: float) -> tuple[str, float | None]:
    """How the load is known (fresh, stale, unreachable, refused or none) and its age."""
    age = None
    if load is not None and load_problem(load) is None:
        age = now - load.scraped_at
        age = max(0.0, age) if math.isfinite(age) else None
    if not settings.has_metrics:
        return METRICS_NONE, age
    if load is None:
        return METRICS_UNREACHABLE, age
    if not load.ok:
        return (METRICS_REFUSED if load.refused is True else METRICS_UNREACHABLE), age
    if age is None:
        return METRICS_REFUSED, age
    return (METRICS_STALE if age > settings.metrics_max_age_s else METRICS_FRESH), age
