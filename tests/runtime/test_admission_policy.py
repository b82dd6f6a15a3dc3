"""Tests for runtime.policy.admission: the admission rule as a table and as invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.policy.admission import (
    REASON_BREAKER_OPEN,
    REASON_MAX_QUEUE_WAIT,
    REASON_MAX_QUEUED,
    REASON_NOT_DRAINING,
    REASON_PAUSED,
    RETRY_AFTER_MAX_S,
    RETRY_AFTER_MIN_S,
    AdmissionLimits,
    KeyLimits,
    Stall,
    decide,
    decide_key,
)

UNBOUNDED = AdmissionLimits()
WAIT5 = AdmissionLimits(max_queue_wait_s=5.0)


@pytest.mark.parametrize(
    ("depth", "limits", "rate", "reason", "retry"),
    [
        (10_000, UNBOUNDED, 0.0, None, None),
        (9, AdmissionLimits(max_queued=10), 0.0, None, None),
        (10, AdmissionLimits(max_queued=10), 0.0, REASON_MAX_QUEUED, 1.0),
        (10, AdmissionLimits(max_queued=10), 2.0, REASON_MAX_QUEUED, 0.5),
        (13, AdmissionLimits(max_queued=10), 2.0, REASON_MAX_QUEUED, 2.0),
        # 20 ahead draining at 4/s: 5 s of waiting.
        (20, AdmissionLimits(max_queue_wait_s=5.0), 4.0, None, None),
        (24, AdmissionLimits(max_queue_wait_s=5.0), 4.0, REASON_MAX_QUEUE_WAIT, 1.0),
        # Nothing drained yet: no estimate, so no refusal on the wait.
        (500, AdmissionLimits(max_queue_wait_s=5.0), 0.0, None, None),
        (0, AdmissionLimits(max_queue_wait_s=0.001), 0.0, None, None),
        # Both limits: the count is checked first.
        (30, AdmissionLimits(max_queued=30, max_queue_wait_s=1.0), 1.0, REASON_MAX_QUEUED, 1.0),
    ],
)
def test_admission_table(depth: int, limits: AdmissionLimits, rate: float, reason: str | None,
                         retry: float | None) -> None:  # fmt: skip
    refusal = decide(depth, limits, rate)
    if reason is None:
        assert refusal is None
        return
    assert refusal is not None
    assert (refusal.reason, refusal.depth, refusal.retry_after_s) == (reason, depth, retry)


@pytest.mark.parametrize(
    ("depth", "limits", "rate", "stall", "reason"),
    [
        # A pool that drains nothing has an unbounded wait: refused with max_queue_wait_s, and why.
        (0, WAIT5, 0.0, Stall(paused=True), REASON_PAUSED),
        (3, WAIT5, 9.0, Stall(paused=True, breaker_open=True), REASON_PAUSED),
        (0, WAIT5, 0.0, Stall(breaker_open=True), REASON_BREAKER_OPEN),
        (1, WAIT5, 0.0, Stall(idle_s=5.1), REASON_NOT_DRAINING),
        (1, WAIT5, 0.0, Stall(idle_s=4.9), None),  # not yet: the dispatchers may just be starting
        (0, WAIT5, 0.0, Stall(idle_s=60.0), None),  # no backlog: nothing waits
        # Without max_queue_wait_s the pool is unbounded by choice: nothing changes.
        (500, UNBOUNDED, 0.0, Stall(paused=True, breaker_open=True, idle_s=600), None),
        (9, AdmissionLimits(max_queued=10), 0.0, Stall(paused=True), None),
        # The count is still checked first.
        (
            10,
            AdmissionLimits(max_queued=10, max_queue_wait_s=5.0),
            0.0,
            Stall(paused=True),
            REASON_MAX_QUEUED,
        ),
    ],
)
def test_a_pool_that_drains_nothing_is_refused_with_why(
    depth: int, limits: AdmissionLimits, rate: float, stall: Stall, reason: str | None
) -> None:
    refusal = decide(depth, limits, rate, stall)
    assert (refusal.reason if refusal else None) == reason
    if refusal is not None and reason != REASON_MAX_QUEUED:
        assert refusal.estimated_wait_s == math.inf and refusal.retry_after_s == 5.0
        assert "unbounded" in refusal.describe("p")


def test_an_unbounded_refusal_says_why() -> None:
    refusal = decide(7, WAIT5, 0.0, Stall(idle_s=42.4))
    assert refusal is not None
    assert refusal.describe("backfill") == (
        "pool 'backfill' has drained nothing for 42s: nothing leaves its queue (7 queued), so the wait is "
        "unbounded, over its max_queue_wait_s of 5s; retry in about 5.0s"
    )


def test_refusal_message_names_depth_limit_and_retry() -> None:
    refusal = decide(10, AdmissionLimits(max_queued=10), 0.0)
    assert refusal is not None
    assert refusal.describe("backfill") == (
        "pool 'backfill' is full: 10 requests queued, max_queued is 10; retry in about 1.0s"
    )


@pytest.mark.parametrize(("kwargs", "field"), [({"max_queued": 0}, "max_queued"),
                                                ({"max_queue_wait_s": 0}, "max_queue_wait_s")])  # fmt: skip
def test_bad_limits_are_refused(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        AdmissionLimits(**kwargs)  # type: ignore[arg-type]


@given(
    depth=st.integers(0, 10_000),
    max_queued=st.none() | st.integers(1, 1000),
    max_wait=st.none() | st.floats(0.01, 600),
    rate=st.floats(0, 1000),
)
def test_admission_invariants(
    depth: int, max_queued: int | None, max_wait: float | None, rate: float
) -> None:
    limits = AdmissionLimits(max_queued=max_queued, max_queue_wait_s=max_wait)
    refusal = decide(depth, limits, rate)
    if max_queued is not None and depth >= max_queued:
        assert refusal is not None and refusal.reason == REASON_MAX_QUEUED
    if refusal is None:
        # An admitted request never takes the depth past max_queued.
        assert max_queued is None or depth + 1 <= max_queued
    else:
        assert RETRY_AFTER_MIN_S <= refusal.retry_after_s <= RETRY_AFTER_MAX_S
    if not limits.bounded:
        assert refusal is None


@pytest.mark.parametrize(
    ("open_count", "queued", "max_in_flight", "max_queued", "expected"),
    [
        (0, 0, None, None, None),
        (2, 0, 2, None, "key_max_in_flight"),
        (1, 1, 2, None, None),
        (3, 1, None, 1, "key_max_queued"),
        (3, 0, None, 1, None),  # all running: nothing queued
        (2, 2, 2, 2, "key_max_in_flight"),  # the open count is checked first
        (1, 1, 5, 1, "key_max_queued"),
    ],
)
def test_a_keys_own_limits(
    open_count: int, queued: int, max_in_flight: int | None, max_queued: int | None, expected: str | None
) -> None:
    assert decide_key(open_count, queued, KeyLimits("1", "k", max_in_flight, max_queued)) == expected
