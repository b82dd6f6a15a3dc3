"""Tests for runtime.backends.breaker: transition tables and properties over random event sequences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.backends.breaker import (
    BLOCKED_REASON,
    CLOSED,
    HALF_OPEN,
    OPEN,
    Breaker,
    BreakerPolicy,
    BreakerState,
)

POLICY = BreakerPolicy(failure_threshold=3, window_s=10.0, open_s=5.0, half_open_probes=2)
B = Breaker(POLICY)


def run(events: list[tuple[str, float]], breaker: Breaker = B) -> tuple[BreakerState, list[bool]]:
    """Apply ("fail"|"ok"|"allow", now) events; return the final state and the allow answers."""
    state, answers = BreakerState(), []
    for kind, now in events:
        if kind == "fail":
            state = breaker.record_failure(state, now)
        elif kind == "ok":
            state = breaker.record_success(state, now)
        else:
            ok, state = breaker.allow(state, now)
            answers.append(ok)
    return state, answers


@pytest.mark.parametrize(
    ("events", "mode", "answers"),
    [
        ([], CLOSED, []),
        ([("allow", 0.0)], CLOSED, [True]),
        ([("fail", 0.0), ("fail", 1.0)], CLOSED, []),
        ([("fail", 0.0), ("fail", 1.0), ("fail", 2.0)], OPEN, []),
        # failures outside the window do not add up
        ([("fail", 0.0), ("fail", 1.0), ("fail", 11.0)], CLOSED, []),
        ([("fail", 0.0), ("fail", 5.0), ("fail", 9.9), ("allow", 9.9)], OPEN, [False]),
        # open: refused until open_s passed, then half-open with probes
        ([("fail", 0.0)] * 3 + [("allow", 4.9)], OPEN, [False]),
        ([("fail", 0.0)] * 3 + [("allow", 5.0)], HALF_OPEN, [True]),
        (
            [("fail", 0.0)] * 3 + [("allow", 5.0), ("allow", 5.1), ("allow", 5.2)],
            HALF_OPEN,
            [True, True, False],
        ),
        # half-open: enough successful probes close it
        ([("fail", 0.0)] * 3 + [("allow", 5.0), ("allow", 5.0), ("ok", 6.0)], HALF_OPEN, [True, True]),
        (
            [("fail", 0.0)] * 3 + [("allow", 5.0), ("allow", 5.0), ("ok", 6.0), ("ok", 6.5)],
            CLOSED,
            [True, True],
        ),
        # half-open: one failure reopens and restarts the timer
        ([("fail", 0.0)] * 3 + [("allow", 5.0), ("fail", 6.0), ("allow", 10.0)], OPEN, [True, False]),
        ([("fail", 0.0)] * 3 + [("allow", 5.0), ("fail", 6.0), ("allow", 11.0)], HALF_OPEN, [True, True]),
        # failures and successes while open change nothing
        ([("fail", 0.0)] * 3 + [("fail", 4.0), ("ok", 4.5), ("allow", 5.0)], HALF_OPEN, [True]),
        # lost probes: after another open_s with every slot taken, a fresh probe round starts
        (
            [("fail", 0.0)] * 3 + [("allow", 5.0), ("allow", 5.0), ("allow", 9.9), ("allow", 10.0)],
            HALF_OPEN,
            [True, True, False, True],
        ),
        # success while closed does not erase counted failures (they age out of the window)
        ([("fail", 0.0), ("fail", 1.0), ("ok", 1.5), ("fail", 2.0)], OPEN, []),
    ],
)
def test_transitions(events, mode, answers):
    state, got = run(events)
    assert state.mode == mode
    assert got == answers


def test_closing_resets_counters_and_trips_count():
    state, _ = run([("fail", 0.0)] * 3 + [("allow", 5.0), ("allow", 5.0), ("ok", 6.0), ("ok", 6.0)])
    assert state == BreakerState(mode=CLOSED, since=6.0, trips=1)
    state = B.record_failure(state, 7.0)
    assert state.failures == (7.0,)


def test_blocked_and_retry_in_change_nothing():
    state, _ = run([("fail", 0.0)] * 3)
    assert B.blocked(state, 1.0) == BLOCKED_REASON
    assert B.retry_in(state, 1.0) == pytest.approx(4.0)
    assert B.blocked(state, 5.0) is None
    assert B.retry_in(state, 5.0) == 0.0
    assert state.mode == OPEN  # blocked() did not move it to half-open
    assert B.blocked(BreakerState(), 0.0) is None
    assert B.retry_in(BreakerState(), 0.0) == 0.0


def test_default_policy_values():
    p = BreakerPolicy()
    assert (p.failure_threshold, p.window_s, p.open_s, p.half_open_probes) == (5, 30.0, 10.0, 1)
    state, answers = run(
        [("fail", float(i)) for i in range(5)] + [("allow", 14.0), ("allow", 14.1)], Breaker()
    )
    assert state.mode == HALF_OPEN
    assert answers == [True, False]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"failure_threshold": 0}, "failure_threshold must be >= 1"),
        ({"window_s": 0}, "window_s must be > 0"),
        ({"open_s": -1}, "open_s must be >= 0"),
        ({"half_open_probes": 0}, "half_open_probes must be >= 1"),
    ],
)
def test_invalid_policy(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BreakerPolicy(**kwargs)


events = st.lists(
    st.tuples(st.sampled_from(["fail", "ok", "allow"]), st.floats(0.0, 3.0, allow_nan=False)), max_size=60
)


@settings(max_examples=200, deadline=None)
@given(steps=events)
def test_properties_over_random_sequences(steps):
    state, now = BreakerState(), 0.0
    for kind, dt in steps:
        now += dt
        before = state
        if kind == "fail":
            state = B.record_failure(state, now)
        elif kind == "ok":
            state = B.record_success(state, now)
        else:
            ok, state = B.allow(state, now)
            if before.mode == OPEN and now < before.since + POLICY.open_s:
                assert not ok, "open breaker let a request through before open_s"
            if before.mode == CLOSED:
                assert ok and state == before
        assert state.mode in (CLOSED, OPEN, HALF_OPEN)
        assert len(state.failures) < POLICY.failure_threshold
        if kind == "fail":
            assert all(now - t < POLICY.window_s for t in state.failures)
        assert state.probes <= POLICY.half_open_probes
        assert state.trips >= before.trips
        if state.mode == OPEN and before.mode != OPEN:
            assert state.trips == before.trips + 1


@settings(max_examples=200, deadline=None)
@given(steps=events, extra=st.floats(0.0, 12.0, allow_nan=False))
def test_allowance_is_exactly_how_many_calls_allow_lets_through_now(steps, extra):
    timeline, now = [], 0.0
    for kind, dt in steps:
        now += dt
        timeline.append((kind, now))
    state, _ = run(timeline)
    now += extra
    limit = B.allowance(state, now)
    assert (limit == 0) == (B.blocked(state, now) is not None)
    granted, probe = 0, state
    for _ in range(POLICY.half_open_probes + 3):
        ok, probe = B.allow(probe, now)
        if not ok:
            break
        granted += 1
    if limit is None:
        assert state.mode == CLOSED and granted == POLICY.half_open_probes + 3
    else:
        assert granted == limit


def test_release_gives_an_unused_probe_slot_back():
    state, _ = run([("fail", 0.0), ("fail", 1.0), ("fail", 2.0), ("allow", 8.0), ("allow", 8.0)])
    assert state.mode == HALF_OPEN and B.allowance(state, 8.0) == 0
    state = B.release(state)
    assert B.allowance(state, 8.0) == 1
    assert B.allow(state, 8.0)[0]
    assert B.release(BreakerState()) == BreakerState()  # closed: nothing to give back
