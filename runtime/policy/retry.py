"""The retry decision: should a failed attempt run again, and when? Pure: no clock, no Valkey.

Only transient failures retry: the backend could not be reached (``backend_connect_error``), did
not answer in time (``backend_timeout``), answered 429 or 5xx, or its circuit breaker refused the
call before it was made (``breaker_open``). A 4xx request error never retries (the same request
would fail the same way), nor does a call cut short by the caller's deadline, nor a retry whose
due time would fall past the deadline: the producer would have stopped waiting.

The pause is exponential backoff with full jitter (a uniform draw between 0 and
``min(cap, base * 2 ** (attempt - 1))``), raised to the backend's ``Retry-After`` when it sent one.
The caller draws the jitter (a float in [0, 1)) so that the decision stays a function of its inputs.
"""

from __future__ import annotations

from runtime.errors import BackendHTTPError, DispatchError
from runtime.immutable import immutable

RETRY = "retry"
NOT_RETRYABLE = "not_retryable"
ATTEMPTS_EXHAUSTED = "attempts_exhausted"
DEADLINE = "deadline"

# Retryable error types besides HTTP statuses; BackendHTTPError decides by its status (429, 5xx).
TRANSIENT_ERROR_TYPES = frozenset({"backend_connect_error", "backend_timeout", "breaker_open"})


@immutable
class RetryPolicy:
    """A pool's retry settings: ``max_attempts`` 1 means no retry."""

    max_attempts: int = 1
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if not 0 <= self.backoff_base_s <= self.backoff_cap_s:
            raise ValueError(
                f"backoff needs 0 <= base <= cap, got base {self.backoff_base_s} and cap {self.backoff_cap_s}"
            )


@immutable
class Failure:
    """What the decision needs to know of one failed attempt."""

    error_type: str
    status_code: int = 0
    retry_after_s: float | None = None
    cut_by_deadline: bool = False

    @classmethod
    def of(cls, error: DispatchError, *, cut_by_deadline: bool = False) -> Failure:
        if isinstance(error, BackendHTTPError):
            return cls(error.error_type, error.status_code, error.retry_after_s, cut_by_deadline)
        return cls(error.error_type, cut_by_deadline=cut_by_deadline)


@immutable
class RetryDecision:
    """``retry`` with the time the next attempt is due, or why the failure is final."""

    reason: str
    due_at: float = 0.0
    delay_s: float = 0.0

    @property
    def retry(self) -> bool:
        return self.reason == RETRY


def is_transient(failure: Failure) -> bool:
    """True for failures the same request may well not meet again: connection, timeout, 429, 5xx."""
    if failure.cut_by_deadline:
        return False
    if failure.error_type == BackendHTTPError.error_type:
        return failure.status_code == 429 or 500 <= failure.status_code <= 599
    return failure.error_type in TRANSIENT_ERROR_TYPES


def backoff_delay(policy: RetryPolicy, attempt: int, jitter: float) -> float:
    """Full jitter after ``attempt`` (1-based) failed: ``jitter`` of the capped exponential ceiling."""
    # The exponent is bounded so a large attempt number cannot overflow the float.
    ceiling = min(policy.backoff_cap_s, policy.backoff_base_s * 2.0 ** min(attempt - 1, 62))
    return ceiling * min(max(jitter, 0.0), 1.0)


def decide(
    policy: RetryPolicy,
    failure: Failure,
    *,
    attempt: int,
    now: float,
    deadline: float | None,
    jitter: float,
) -> RetryDecision:
    """Whether attempt number ``attempt`` (1-based), which failed with ``failure`` at ``now``, runs again."""
    if not is_transient(failure):
        return RetryDecision(NOT_RETRYABLE)
    if attempt >= policy.max_attempts:
        return RetryDecision(ATTEMPTS_EXHAUSTED)
    delay = backoff_delay(policy, attempt, jitter)
    if failure.retry_after_s is not None:
        delay = max(delay, failure.retry_after_s)
    due_at = now + delay
    if deadline is not None and due_at >= deadline:
        return RetryDecision(DEADLINE)
    return RetryDecision(RETRY, due_at=due_at, delay_s=delay)
