"""Tests for runtime.policy.retry: a table of decisions, then hypothesis invariants."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.backends.adapter import parse_retry_after
from runtime.errors import (
    BackendConnectError,
    BackendHTTPError,
    BackendInvalidResponse,
    BackendTimeout,
    DispatchError,
    Rejected,
)
from runtime.policy.retry import (
    ATTEMPTS_EXHAUSTED,
    DEADLINE,
    NOT_RETRYABLE,
    RETRY,
    Failure,
    RetryPolicy,
    backoff_delay,
    decide,
    is_transient,
)

THREE = RetryPolicy(max_attempts=3, backoff_base_s=1.0, backoff_cap_s=8.0)
NOW = 1_000.0


def http(status: int, retry_after: float | None = None) -> Failure:
    return Failure.of(BackendHTTPError("x", status_code=status, retry_after_s=retry_after))


@pytest.mark.parametrize(
    ("failure", "attempt", "deadline", "jitter", "reason", "delay"),
    [
        (Failure.of(BackendConnectError()), 1, None, 0.5, RETRY, 0.5),
        (Failure.of(BackendTimeout()), 2, None, 0.5, RETRY, 1.0),  # ceiling doubles: 2 s
        (http(503), 1, None, 1.0, RETRY, 1.0),
        (http(500), 1, None, 0.0, RETRY, 0.0),
        (http(429, retry_after=5.0), 1, None, 0.5, RETRY, 5.0),  # Retry-After wins over a shorter pause
        (http(429, retry_after=0.1), 2, None, 1.0, RETRY, 2.0),  # and never shortens a longer one
        (http(400), 1, None, 0.5, NOT_RETRYABLE, 0.0),
        (http(404), 1, None, 0.5, NOT_RETRYABLE, 0.0),
        (http(408), 1, None, 0.5, NOT_RETRYABLE, 0.0),
        (Failure.of(BackendInvalidResponse()), 1, None, 0.5, NOT_RETRYABLE, 0.0),
        (Failure.of(Rejected()), 1, None, 0.5, NOT_RETRYABLE, 0.0),
        (Failure.of(DispatchError()), 1, None, 0.5, NOT_RETRYABLE, 0.0),
        (Failure.of(BackendTimeout(), cut_by_deadline=True), 1, None, 0.5, NOT_RETRYABLE, 0.0),
        (Failure.of(BackendConnectError()), 3, None, 0.5, ATTEMPTS_EXHAUSTED, 0.0),
        (Failure.of(BackendConnectError()), 7, None, 0.5, ATTEMPTS_EXHAUSTED, 0.0),
        (Failure.of(BackendConnectError()), 1, NOW + 0.4, 0.5, DEADLINE, 0.0),  # due 0.5 s: past it
        (Failure.of(BackendConnectError()), 1, NOW + 0.6, 0.5, RETRY, 0.5),
        (http(429, retry_after=30.0), 1, NOW + 10.0, 0.0, DEADLINE, 0.0),
    ],
)
def test_decision_table(
    failure: Failure, attempt: int, deadline: float | None, jitter: float, reason: str, delay: float
) -> None:
    decision = decide(THREE, failure, attempt=attempt, now=NOW, deadline=deadline, jitter=jitter)
    assert decision.reason == reason
    assert decision.retry == (reason == RETRY)
    if decision.retry:
        assert decision.delay_s == pytest.approx(delay)
        assert decision.due_at == pytest.approx(NOW + delay)


def test_max_attempts_one_never_retries() -> None:
    decision = decide(RetryPolicy(), http(503), attempt=1, now=NOW, deadline=None, jitter=0.5)
    assert decision.reason == ATTEMPTS_EXHAUSTED


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"max_attempts": 0}, "max_attempts"), ({"backoff_base_s": 5.0, "backoff_cap_s": 1.0}, "base <= cap")],
)
def test_policy_refuses_nonsense(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("header", "seconds"),
    [(None, None), ("", None), ("3", 3.0), (" 1.5 ", 1.5), ("-2", 0.0), ("soon", None), ("nan", None)],
)
def test_parse_retry_after_seconds(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header) == seconds


def test_parse_retry_after_http_date() -> None:
    # 1_000_000_000 is Sun, 09 Sep 2001 01:46:40 GMT.
    assert parse_retry_after("Sun, 09 Sep 2001 01:46:50 GMT", now=1_000_000_000.0) == pytest.approx(10.0)


policies = st.builds(
    lambda attempts, base, extra: RetryPolicy(attempts, base, base + extra),
    st.integers(1, 10),
    st.floats(0, 5),
    st.floats(0, 60),
)
failures = st.one_of(
    st.builds(http, st.integers(400, 599), st.none() | st.floats(0, 120)),
    st.sampled_from([Failure("backend_connect_error"), Failure("backend_timeout"), Failure("breaker_open")]),
    st.sampled_from([Failure("backend_invalid_response"), Failure("rejected"), Failure("expired")]),
    st.builds(Failure, st.just("backend_timeout"), cut_by_deadline=st.just(True)),
)


@given(
    policy=policies,
    failure=failures,
    attempt=st.integers(1, 12),
    deadline=st.none() | st.floats(NOW - 10, NOW + 200),
    jitter=st.floats(0, 1, exclude_max=True),
)
def test_retry_invariants(
    policy: RetryPolicy, failure: Failure, attempt: int, deadline: float | None, jitter: float
) -> None:
    decision = decide(policy, failure, attempt=attempt, now=NOW, deadline=deadline, jitter=jitter)
    if not decision.retry:
        return
    # Only transient failures, never more than max_attempts, never due past the deadline.
    assert is_transient(failure)
    assert failure.status_code not in range(400, 429) and failure.status_code not in range(430, 500)
    assert attempt + 1 <= policy.max_attempts
    assert deadline is None or decision.due_at < deadline
    # The pause is within the jittered ceiling, except that Retry-After may lengthen it.
    assert decision.delay_s >= 0
    assert decision.delay_s <= max(policy.backoff_cap_s, failure.retry_after_s or 0.0)
    if failure.retry_after_s is not None:
        assert decision.delay_s >= failure.retry_after_s


@given(policy=policies, attempt=st.integers(1, 200), jitter=st.floats(0, 1))
def test_backoff_ceiling_grows_to_the_cap(policy: RetryPolicy, attempt: int, jitter: float) -> None:
    assert backoff_delay(policy, attempt, jitter) <= backoff_delay(policy, attempt + 1, jitter) + 1e-9
    assert backoff_delay(policy, attempt, jitter) <= policy.backoff_cap_s
