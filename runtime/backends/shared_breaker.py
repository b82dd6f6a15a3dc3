"""Circuit breakers shared by the fleet: one state per backend, kept in Valkey.

The transitions are the pure :mod:`runtime.backends.breaker`; this shell keeps each backend's
:class:`~runtime.backends.breaker.BreakerState` as JSON under ``key:llm:breaker:{backend_id}``, so
every dispatcher of every group sees the same state and a restarted dispatcher does not reset it.
A change is an optimistic transaction (WATCH, read, pure transition, MULTI/SET/EXEC, again on a
conflict): of two dispatchers asking for the one half-open probe at the same instant, exactly one
gets it. Times are wall-clock seconds, the only clock processes share.

Reads are cheap: the dispatcher reads every state of interest with the backends' load, at the end of
each pipeline a scheduling round sends (:mod:`runtime.backends.fleet`), and hands them over with
:meth:`SharedBreakers.update`; the before-deciding questions (:meth:`blocked`, :meth:`allowance`)
answer from that copy. Writes happen only when a state changes: a healthy backend costs no write
per call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import redis.asyncio as aioredis
from redis.exceptions import WatchError

from runtime.backends.breaker import Breaker, BreakerState, decode_state, encode_state
from runtime.errors import DispatchError
from runtime.queue.keys import BREAKER_TTL_S, KeySpace
from runtime.wire.backendconfig import BreakerPolicy

log = logging.getLogger(__name__)
_T = TypeVar("_T")
# Conflicting writers are other dispatchers' transitions: a handful of retries always gets through.
_MAX_ATTEMPTS = 16

__all__ = ["SharedBreakers"]


class SharedBreakers:
    """The fleet's breakers, one per backend id, each under its backend's own policy."""

    def __init__(
        self, client: aioredis.Redis, keys: KeySpace, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.client = client
        self.keys = keys
        self.clock = clock
        self._breakers: dict[str, Breaker] = {}
        self._states: dict[str, BreakerState] = {}

    def __repr__(self) -> str:
        return f"<SharedBreakers {self.modes()}>"

    def configure(self, policies: Mapping[str, BreakerPolicy]) -> None:
        """The backends of interest and their policies (from the published configuration)."""
        self._breakers = {backend_id: Breaker(policy) for backend_id, policy in policies.items()}
        self._states = {b: s for b, s in self._states.items() if b in self._breakers}

    def update(self, backend_id: str, raw: bytes | None) -> None:
        """The state as just read from Valkey (``None``: no state stored, a closed breaker)."""
        if backend_id in self._breakers:
            self._states[backend_id] = _read_state(backend_id, raw)

    def state(self, backend_id: str) -> BreakerState:
        return self._states.get(backend_id, BreakerState())

    def blocked(self, backend_id: str) -> str | None:
        """The skip reason for pools on this backend as last read, or None when a call may go."""
        breaker = self._breakers.get(backend_id)
        return None if breaker is None else breaker.blocked(self.state(backend_id), self.clock())

    def allowance(self, backend_id: str) -> int | None:
        """Calls that may go now as last read (None: no limit); see :meth:`Breaker.allowance`."""
        breaker = self._breakers.get(backend_id)
        return None if breaker is None else breaker.allowance(self.state(backend_id), self.clock())

    async def acquire(self, backend_id: str) -> bool:
        """Right before a real call: False when the breaker refuses it. In half-open it takes the
        fleet's probe slot atomically; while closed (as last read) it costs no round trip."""
        breaker = self._breakers.get(backend_id)
        if breaker is None:
            return True
        if self.state(backend_id).mode == "closed":
            return True

        def allow(state: BreakerState) -> tuple[BreakerState, bool]:
            ok, new = breaker.allow(state, self.clock())
            return new, ok

        return await self._transition(backend_id, allow)

    async def release(self, backend_id: str) -> None:
        """Gives back a probe slot taken by :meth:`acquire` for a call that did not happen."""
        breaker = self._breakers.get(backend_id)
        if breaker is not None and self.state(backend_id).mode != "closed":
            await self._transition(backend_id, lambda s: (breaker.release(s), None))

    async def record(self, backend_id: str, error: DispatchError | None) -> None:
        """A call's outcome. Only retryable backend failures count against a backend; a call cut
        short by its caller's deadline gives its probe slot back."""
        breaker = self._breakers.get(backend_id)
        if breaker is None:
            return
        now = self.clock()
        if error is None:
            if self.state(backend_id).mode == "closed":
                return  # closed: failures age out of the window, nothing to write
            await self._transition(backend_id, lambda s: (breaker.record_success(s, now), None))
        elif error.error_type == "deadline_exceeded":
            await self.release(backend_id)
        elif error.retryable:
            await self._transition(backend_id, lambda s: (breaker.record_failure(s, now), None))

    def modes(self) -> dict[str, dict[str, object]]:
        """Per backend id: mode and how often it opened, for snapshots."""
        return {b: {"mode": self.state(b).mode, "trips": self.state(b).trips} for b in sorted(self._breakers)}

    async def _transition(
        self, backend_id: str, step: Callable[[BreakerState], tuple[BreakerState, _T]]
    ) -> _T:
        key = self.keys.backend_breaker(backend_id)
        for _ in range(_MAX_ATTEMPTS):
            try:
                async with self.client.pipeline(transaction=True) as pipe:
                    await pipe.watch(key)
                    state = _read_state(backend_id, await pipe.get(key))
                    new, result = step(state)
                    if new != state:
                        pipe.multi()
                        pipe.set(key, encode_state(new), px=int(BREAKER_TTL_S * 1000))
                        await pipe.execute()
                    else:
                        await pipe.unwatch()
                self._states[backend_id] = new
                return result
            except WatchError:
                continue
        raise RuntimeError(f"breaker of backend {backend_id!r}: {_MAX_ATTEMPTS} conflicting writers in a row")


def _read_state(backend_id: str, raw: bytes | str | None) -> BreakerState:
    """An unreadable state is logged and treated as closed (the next transition overwrites it)."""
    try:
        return decode_state(raw)
    except ValueError as exc:
        log.warning("backend %s: %s; treated as closed", backend_id, exc)
        return BreakerState()
