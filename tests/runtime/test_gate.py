"""Tests for runtime.backends.gate: a table of decisions, and invariants over random loads."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.backends.gate import (
    METRICS_FRESH,
    METRICS_NONE,
    METRICS_REFUSED,
    METRICS_STALE,
    METRICS_UNREACHABLE,
    RETRY_AFTER_HOLD_MAX_S,
    SKIP_BACKEND_CAP,
    SKIP_BACKEND_RETRY_AFTER,
    SKIP_BACKEND_SATURATED,
    GateSettings,
    gate,
    hold_ms,
)
from runtime.backends.metrics import BackendLoad
from runtime.backends.status import status_from_replies
from runtime.wire.backendconfig import BackendConfig

S = GateSettings(max_in_flight=16, max_waiting=5, max_kv_cache_usage=0.8, metrics_max_age_s=1.0)
NOW = 1000.0


def load(
    waiting: int = 0, kv: float = 0.1, at_scrape: int = 0, age: float = 0.1, error: str = ""
) -> BackendLoad:
    return BackendLoad("b", NOW - age, running=4, waiting=waiting, kv_usage=kv, in_flight_at_scrape=at_scrape,
                       error=error)  # fmt: skip


@pytest.mark.parametrize(
    ("settings", "shared", "in_flight", "limit", "reason", "metrics"),
    [
        # Room in the backend's queue: launches since the scrape count as waiting.
        (S, load(waiting=0, at_scrape=4), 4, 9, None, METRICS_FRESH),
        (S, load(waiting=0, at_scrape=4), 9, 9, SKIP_BACKEND_SATURATED, METRICS_FRESH),
        (S, load(waiting=3, at_scrape=7), 8, 9, None, METRICS_FRESH),
        # Its queue already past the threshold: hold below what was in flight at the scrape.
        (S, load(waiting=8, at_scrape=12), 10, 9, SKIP_BACKEND_SATURATED, METRICS_FRESH),
        # KV cache full: nothing beyond what was in flight at the scrape.
        (S, load(waiting=0, kv=0.85, at_scrape=4), 4, 4, SKIP_BACKEND_SATURATED, METRICS_FRESH),
        (S, load(waiting=0, kv=0.85, at_scrape=4), 3, 4, None, METRICS_FRESH),
        # Plenty of room in the backend, but max_in_flight holds.
        (S, load(waiting=0, at_scrape=14), 16, 16, SKIP_BACKEND_CAP, METRICS_FRESH),
        # Someone else's traffic queues there: saturated though we run nothing.
        (S, load(waiting=40, at_scrape=0), 0, 0, SKIP_BACKEND_SATURATED, METRICS_FRESH),
        # Stale, failed or missing metrics: max_in_flight alone, and said so.
        (S, load(waiting=40, age=1.5), 3, 16, None, METRICS_STALE),
        (S, load(waiting=40, error="connect refused"), 3, 16, None, METRICS_UNREACHABLE),
        (S, None, 16, 16, SKIP_BACKEND_CAP, METRICS_UNREACHABLE),
        (GateSettings(max_in_flight=2, has_metrics=False), None, 1, 2, None, METRICS_NONE),
        (GateSettings(max_in_flight=2, has_metrics=False), None, 2, 2, SKIP_BACKEND_CAP, METRICS_NONE),
    ],
)
def test_gate_table(settings: GateSettings, shared: BackendLoad | None, in_flight: int, limit: int,
                    reason: str | None, metrics: str) -> None:  # fmt: skip
    decision = gate(settings, shared, in_flight=in_flight, now=NOW)
    assert (decision.limit, decision.reason, decision.metrics) == (limit, reason, metrics)


def test_a_scrape_from_a_clock_slightly_ahead_is_fresh() -> None:
    decision = gate(S, load(age=-0.05), in_flight=0, now=NOW)
    assert decision.metrics == METRICS_FRESH and decision.age_s == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"max_in_flight": 1, "max_waiting": -1}, "max_waiting"),
        ({"max_in_flight": 1, "max_kv_cache_usage": 0}, "max_kv_cache_usage"),
        ({"max_in_flight": 1, "max_kv_cache_usage": 1.2}, "max_kv_cache_usage"),
        ({"max_in_flight": 1, "metrics_max_age_s": 0}, "metrics_max_age_s"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GateSettings(**kwargs)  # type: ignore[arg-type]


@given(
    cap=st.integers(1, 64),
    max_waiting=st.integers(0, 20),
    waiting=st.integers(0, 100),
    kv=st.floats(0, 1),
    at_scrape=st.integers(0, 64),
    launched=st.integers(0, 64),
    age=st.floats(0, 3),
)
def test_gate_invariants(cap: int, max_waiting: int, waiting: int, kv: float, at_scrape: int, launched: int,
                         age: float) -> None:  # fmt: skip
    settings = GateSettings(max_in_flight=cap, max_waiting=max_waiting)
    shared = load(waiting=waiting, kv=kv, at_scrape=at_scrape, age=age)
    in_flight = at_scrape + launched
    decision = gate(settings, shared, in_flight=in_flight, now=NOW)
    # max_in_flight always holds; a reason exactly when the limit is reached.
    assert 0 <= decision.limit <= cap
    assert (decision.reason is None) == (in_flight < decision.limit)
    if decision.metrics == METRICS_FRESH:
        # Counting every launch since the scrape as waiting, the backend's queue stays at its
        # threshold (or where it already was), and a full KV cache gets nothing new.
        assert waiting + max(0, decision.limit - at_scrape) <= max(waiting, max_waiting)
        if kv >= settings.max_kv_cache_usage:
            assert decision.limit <= at_scrape
    else:
        assert decision.limit == cap


# --- issue 19: the load is read back from Valkey, so it may hold anything JSON can ---------------
JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)


@given(
    settings=st.builds(
        GateSettings,
        max_in_flight=st.integers(1, 10**6),
        max_waiting=st.integers(0, 10**6),
        max_kv_cache_usage=st.floats(0.01, 1),
        metrics_max_age_s=st.floats(0.01, 1e6),
        has_metrics=st.booleans(),
    ),
    shared=st.none()
    | st.builds(
        BackendLoad,
        backend_id=st.text(max_size=3),
        scraped_at=JSON_VALUES | st.floats(NOW - 10, NOW + 10),
        running=JSON_VALUES,
        waiting=JSON_VALUES,
        kv_usage=JSON_VALUES,
        in_flight_at_scrape=JSON_VALUES,
        error=JSON_VALUES,
        refused=JSON_VALUES,
        kv_exported=JSON_VALUES,
    ),
    in_flight=st.integers(),
    now=st.floats(allow_nan=True, allow_infinity=True) | st.just(NOW),
    hold_s=st.just(0.0) | st.floats(allow_nan=True, allow_infinity=True),
)
def test_gate_is_total(
    settings: GateSettings, shared: BackendLoad | None, in_flight: int, now: float, hold_s: float
) -> None:
    """No load value can make the gate raise (a NaN shared as null used to raise TypeError in every
    round); whatever it holds, max_in_flight holds and the reason matches the limit; a Retry-After
    hold admits nothing."""
    decision = gate(settings, shared, in_flight=in_flight, now=now, hold_s=hold_s)
    assert type(decision.limit) is int and 0 <= decision.limit <= settings.max_in_flight
    assert (decision.reason is None) == (in_flight < decision.limit)
    if hold_s > 0:
        assert (decision.limit, decision.hold_s) == (0, hold_s)
    elif decision.metrics != METRICS_FRESH:
        assert decision.limit == settings.max_in_flight
    assert decision.age_s is None or decision.age_s >= 0


@pytest.mark.parametrize(
    "bad",
    [
        {"kv_usage": None},
        {"kv_usage": float("nan")},
        {"kv_usage": 3.0},
        {"waiting": -1},
        {"waiting": 2.5},
        {"running": True},
        {"in_flight_at_scrape": "4"},
        {"scraped_at": float("inf")},
        {"kv_exported": None},
    ],
)
def test_a_load_breaking_the_rules_is_refused(bad: dict[str, object]) -> None:
    shared = BackendLoad(**{"backend_id": "b", "scraped_at": NOW, **bad})  # type: ignore[arg-type]
    decision = gate(S, shared, in_flight=3, now=NOW)
    assert (decision.limit, decision.reason, decision.metrics) == (16, None, METRICS_REFUSED)


def test_a_refused_scrape_says_refused_and_an_unanswered_one_unreachable() -> None:
    refused = BackendLoad("b", NOW, error="vllm:num_requests_running is inf", refused=True)
    assert gate(S, refused, in_flight=0, now=NOW).metrics == METRICS_REFUSED
    assert gate(S, load(error="ConnectError"), in_flight=0, now=NOW).metrics == METRICS_UNREACHABLE


LOAD_FIELDS = ("backend_id", "scraped_at", "running", "waiting", "kv_usage", "in_flight_at_scrape", "error",
               "scrape_ms", "refused", "kv_metric", "kv_exported")  # fmt: skip


@given(
    fields=st.dictionaries(st.sampled_from(LOAD_FIELDS) | st.text(max_size=3), JSON_VALUES, max_size=12),
    raw=st.binary(max_size=20),
)
def test_any_shared_load_gives_a_status_and_its_words(fields: dict[str, object], raw: bytes) -> None:
    """The admin list, the dashboard and /metrics answered 500 on a load shared with null: whatever the
    key holds (any JSON object, any bytes), the status and its words come out, and say refused."""
    config = BackendConfig("b", "http://gpu:8000/v1", max_in_flight=7)
    for shared in (json.dumps(fields).encode(), raw):
        status = status_from_replies(config, [shared, None, 2, -2], NOW)
        assert status.describe() and status.metrics_words()
        assert 0 <= status.limit <= 7
        if status.metrics != METRICS_FRESH and status.metrics != METRICS_STALE:
            assert status.running is None and status.kv_usage is None


# --- issue 24: a 429's Retry-After holds the backend -----------------------------------------------
@pytest.mark.parametrize(
    ("retry_after_s", "ms"),
    [(None, 0), (0.0, 0), (-3.0, 0), (float("nan"), 0), (float("inf"), 0), (0.0004, 1), (2.0, 2000),
     (1e12, int(RETRY_AFTER_HOLD_MAX_S * 1000))],
)  # fmt: skip
def test_hold_ms_is_the_retry_after_bounded(retry_after_s: float | None, ms: int) -> None:
    assert hold_ms(retry_after_s) == ms


def test_a_hold_admits_nothing_whatever_the_metrics_say() -> None:
    fresh = load(waiting=0, kv=0.0)
    assert gate(S, fresh, in_flight=0, now=NOW).room
    held = gate(S, fresh, in_flight=0, now=NOW, hold_s=1.5)
    assert (held.limit, held.reason, held.metrics) == (0, SKIP_BACKEND_RETRY_AFTER, METRICS_FRESH)
    assert held.hold_s == 1.5
    none = gate(GateSettings(max_in_flight=4, has_metrics=False), None, in_flight=0, now=NOW, hold_s=0.1)
    assert (none.limit, none.reason, none.metrics) == (0, SKIP_BACKEND_RETRY_AFTER, METRICS_NONE)
