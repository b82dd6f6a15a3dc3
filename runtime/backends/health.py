"""The dispatcher's circuit breakers, one per backend URL, driven by a monotonic clock.

The transitions are the pure :mod:`runtime.backends.breaker`; this holder only keeps each URL's state and
reads the clock, so the dispatcher can ask "may this pool launch?" before deciding and record each
call's outcome after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from runtime.backends.breaker import Breaker, BreakerState
from runtime.backends.redact import redact_url
from runtime.errors import DeadlineExceeded, DispatchError
from runtime.wire.backendconfig import BreakerPolicy

# The state of a URL with no history; immutable, so one instance serves every lookup.
NO_HISTORY = BreakerState()


class EndpointBreakers:
    def __init__(self, policy: BreakerPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self.breaker = Breaker(policy)
        self.clock = clock
        self._states: dict[str, BreakerState] = {}

    def __repr__(self) -> str:
        return f"<EndpointBreakers {self.modes()}>"

    def blocked(self, url: str) -> str | None:
        """The skip reason for pools on this URL, or None when a call may go."""
        state = self._states.get(url)
        return None if state is None else self.breaker.blocked(state, self.clock())

    def allowance(self, url: str) -> int | None:
        """How many calls may go to this URL now (None: no limit); see :meth:`Breaker.allowance`."""
        state = self._states.get(url)
        return None if state is None else self.breaker.allowance(state, self.clock())

    def release(self, url: str) -> None:
        """Gives back a slot taken by :meth:`acquire` for a call that did not happen."""
        state = self._states.get(url)
        if state is not None:
            self._states[url] = self.breaker.release(state)

    def acquire(self, url: str) -> bool:
        """Called right before a real call: False means the breaker refuses it (it may take a probe slot)."""
        allowed, self._states[url] = self.breaker.allow(self._states.get(url, NO_HISTORY), self.clock())
        return allowed

    def record(self, url: str, error: DispatchError | None) -> None:
        """Only retryable backend failures count against a backend; a bad request is the caller's fault,
        and a call cut short by the caller's deadline says nothing about the backend."""
        state = self._states.get(url, NO_HISTORY)
        if error is None:
            self._states[url] = self.breaker.record_success(state, self.clock())
        elif isinstance(error, DeadlineExceeded):
            self._states[url] = self.breaker.release(state)
        elif error.retryable:
            self._states[url] = self.breaker.record_failure(state, self.clock())

    def modes(self) -> dict[str, dict[str, object]]:
        """Per redacted URL: mode and how often it opened, for snapshots."""
        return {redact_url(url): {"mode": s.mode, "trips": s.trips} for url, s in self._states.items()}
