"""Circuit breaker per backend URL: stop sending to a backend that keeps failing, probe it later.

Pure, like the scheduler: the state is an immutable value, every function takes ``now`` (seconds on
any monotonic clock the caller chooses) and returns the new state; nothing here reads a clock or does
I/O. The dispatcher keeps one :class:`BreakerState` per backend URL.

    closed  --(failure_threshold failures within window_s)-->  open
    open    --(open_s elapsed, next allow)------------------>  half_open (lets half_open_probes through)
    half_open --(half_open_probes successes)---------------->  closed
    half_open --(any failure)------------------------------->  open (timer restarts)

Only retryable backend failures should be recorded as failures (connect errors, timeouts, 408/429/5xx);
the caller decides. A probe that never reports back does not wedge the breaker: after another
``open_s`` in half-open with every probe slot taken, a fresh set of probes is allowed.

Typical use::

    if breaker.blocked(state, now):                  # before deciding: the pool can't launch
        observation = PoolObservation(..., blocked=SKIP_BREAKER_OPEN)
    limit = breaker.allowance(state, now)            # before deciding: offer at most this many heads
    ok, state = breaker.allow(state, now)            # when claiming: may consume a probe slot
    state = breaker.release(state)                   # the claim failed: give the probe slot back
    ...
    state = breaker.record_success(state, now)       # or record_failure(state, now)
"""

from __future__ import annotations

from dataclasses import asdict, replace

import orjson

from runtime.immutable import immutable
from runtime.wire.backendconfig import BreakerPolicy

__all__ = ["BLOCKED_REASON", "CLOSED", "HALF_OPEN", "OPEN", "Breaker", "BreakerPolicy", "BreakerState"]

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"
BLOCKED_REASON = "breaker_open"  # the PoolObservation.blocked / skip reason while the breaker refuses


@immutable
class BreakerState:
    """One backend's breaker. ``since`` is when the current mode began (or the last probe round)."""

    mode: str = CLOSED
    failures: tuple[float, ...] = ()  # times of recent failures while closed, oldest first
    since: float = 0.0
    probes: int = 0  # half-open: probes let through in this probe round
    successes: int = 0  # half-open: probes that succeeded
    trips: int = 0  # how many times the breaker opened (monotonic, for counters)


@immutable
class Breaker:
    """The breaker's transitions under one :class:`BreakerPolicy`."""

    policy: BreakerPolicy = BreakerPolicy()

    def blocked(self, state: BreakerState, now: float) -> str | None:
        """``"breaker_open"`` if a request would be refused now, else None. Changes nothing."""
        allowed, _ = self.allow(state, now)
        return None if allowed else BLOCKED_REASON

    def allowance(self, state: BreakerState, now: float) -> int | None:
        """How many more calls may go now: None when closed (no limit), 0 while open, else probes left.

        The dispatcher offers a pool at most this many heads, so it never claims work the breaker
        would then refuse.
        """
        policy = self.policy
        if state.mode == CLOSED:
            return None
        if state.mode == OPEN:
            return 0 if now < state.since + policy.open_s else policy.half_open_probes
        left = max(0, policy.half_open_probes - state.probes)
        if now >= state.since + policy.open_s:
            return left + policy.half_open_probes  # probes never reported back: then a fresh round
        return left

    def release(self, state: BreakerState) -> BreakerState:
        """Gives back a call slot taken by :meth:`allow` for a call that was never made, or whose
        outcome says nothing about the backend (cut short by the caller's deadline)."""
        if state.mode != HALF_OPEN or state.probes <= 0:
            return state
        return replace(state, probes=state.probes - 1)

    def retry_in(self, state: BreakerState, now: float) -> float:
        """Seconds until a request may be let through again (0 when one may go now)."""
        if state.mode == CLOSED or not self.blocked(state, now):
            return 0.0
        return max(0.0, state.since + self.policy.open_s - now)

    def allow(self, state: BreakerState, now: float) -> tuple[bool, BreakerState]:
        """May a request go to the backend now? Returns the answer and the new state.

        Call it only for a request that is really sent: in half-open it takes a probe slot.
        """
        policy = self.policy
        if state.mode == CLOSED:
            return True, state
        if state.mode == OPEN:
            if now < state.since + policy.open_s:
                return False, state
            return True, replace(state, mode=HALF_OPEN, since=now, probes=1, successes=0)
        if state.probes < policy.half_open_probes:
            return True, replace(state, probes=state.probes + 1)
        if now >= state.since + policy.open_s:  # probes never reported back: try a fresh round
            return True, replace(state, since=now, probes=1, successes=0)
        return False, state

    def record_success(self, state: BreakerState, now: float) -> BreakerState:
        """A request to the backend succeeded."""
        if state.mode != HALF_OPEN:
            return state  # closed: failures age out of the window; open: a late reply changes nothing
        successes = state.successes + 1
        if successes >= self.policy.half_open_probes:
            return BreakerState(mode=CLOSED, since=now, trips=state.trips)
        return replace(state, successes=successes)

    def record_failure(self, state: BreakerState, now: float) -> BreakerState:
        """A request to the backend failed in a way that counts (retryable backend failure)."""
        if state.mode == OPEN:
            return state
        if state.mode == HALF_OPEN:
            return self._open(state, now)
        horizon = now - self.policy.window_s
        failures = (*(t for t in state.failures if t > horizon), now)
        if len(failures) >= self.policy.failure_threshold:
            return self._open(state, now)
        return replace(state, failures=failures)

    @staticmethod
    def _open(state: BreakerState, now: float) -> BreakerState:
        return BreakerState(mode=OPEN, since=now, trips=state.trips + 1)


def encode_state(state: BreakerState) -> bytes:
    """The state as JSON, as the fleet shares it in Valkey (runtime.backends.shared_breaker)."""
    return orjson.dumps(asdict(state))


def decode_state(raw: bytes | str | None) -> BreakerState:
    """A shared state; a missing one is a closed breaker. Raises ValueError when unreadable."""
    if not raw:
        return BreakerState()
    try:
        data = orjson.loads(raw)
        return BreakerState(**{**data, "failures": tuple(data.get("failures", ()))})
    except (orjson.JSONDecodeError, TypeError, AttributeError) as exc:
        raise ValueError(f"unreadable breaker state: {exc}") from exc
