"""The simulated inference engine: running slots, a FIFO of waiting calls, KV-cache accounting.

Like vLLM's scheduler, a call runs when a running slot is free *and* the KV cache can hold its
prompt plus its completion; otherwise it waits, first come first served (no overtaking). While a
call runs, the cache holds its prompt and the tokens generated so far, which is what
``kv_usage`` reports. The decisions (:func:`can_admit`, :func:`kv_usage`) are pure functions of the
state and ``now``; :class:`Engine` is the stateful shell the server awaits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """When a running call produces its tokens, counted from the moment it starts running.

    Token ``k`` (1-based) exists at ``first_token_s + (k - 1) * token_interval_s``; the call is done
    with its last token.
    """

    first_token_s: float
    token_interval_s: float
    tokens: int

    def token_at(self, k: int) -> float:
        return self.first_token_s + (k - 1) * self.token_interval_s

    @property
    def done_s(self) -> float:
        return self.token_at(self.tokens) if self.tokens else self.first_token_s

    def generated(self, elapsed_s: float) -> int:
        """Tokens generated ``elapsed_s`` seconds after the call started running."""
        if self.tokens == 0 or elapsed_s < self.first_token_s:
            return 0
        if self.token_interval_s <= 0:
            return self.tokens
        # The epsilon keeps a token due exactly now from vanishing in float rounding (0.15 - 0.1 < 0.05).
        intervals = int((elapsed_s - self.first_token_s) / self.token_interval_s + 1e-9)
        return min(self.tokens, 1 + intervals)


@dataclass(eq=False)
class Job:
    """One call in the engine: what it holds in the KV cache and when it started running."""

    prompt_tokens: int
    timing: Timing
    started_at: float | None = None

    @property
    def reserved_tokens(self) -> int:
        """What the call may hold at most: its prompt and its whole completion."""
        return self.prompt_tokens + self.timing.tokens

    def kv_tokens(self, now: float) -> int:
        if self.started_at is None:
            return 0
        return self.prompt_tokens + self.timing.generated(now - self.started_at)


def can_admit(*, running: int, reserved_tokens: int, need: int, max_running: int, kv_capacity: int) -> bool:
    """Whether a call needing ``need`` tokens may start now (limits of 0 mean unlimited)."""
    if max_running and running >= max_running:
        return False
    return not kv_capacity or reserved_tokens + need <= kv_capacity


def kv_usage(running: Iterable[Job], now: float, kv_capacity: int) -> float:
    """Fraction (0..1) of the KV cache the running calls hold at ``now``; 0 with an unlimited cache."""
    if not kv_capacity:
        return 0.0
    return min(1.0, sum(job.kv_tokens(now) for job in running) / kv_capacity)


class Engine:
    """Running and waiting calls. ``await engine.start(job)`` ... ``engine.finish(job)``."""

    def __init__(self, *, max_running: int, kv_capacity: int, clock: Callable[[], float]) -> None:
        self.max_running = max_running
        self.kv_capacity = kv_capacity
        self.clock = clock
        self.running: set[Job] = set()
        self._reserved = 0
        self._waiting: deque[tuple[Job, asyncio.Future[None]]] = deque()

    def __repr__(self) -> str:
        return f"<Engine running={len(self.running)} waiting={len(self._waiting)} kv={self.kv_usage():.2f}>"

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def kv_usage(self) -> float:
        return kv_usage(self.running, self.clock(), self.kv_capacity)

    def fits(self, job: Job) -> bool:
        """Whether the call could ever run: an empty cache can hold it."""
        return not self.kv_capacity or job.reserved_tokens <= self.kv_capacity

    async def start(self, job: Job) -> None:
        """Returns once ``job`` runs; without awaiting when it can run at once."""
        if not self._waiting and self._admissible(job):
            self._run(job)
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append((job, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.finish(job)  # admitted just as the client left: free the slot for the next
            else:
                with contextlib.suppress(ValueError):  # already skipped by _admit_waiting
                    self._waiting.remove((job, waiter))
                self._admit_waiting()  # the head may have been what held the others back
            raise

    def finish(self, job: Job) -> None:
        """Frees what a running call holds and starts the waiting calls that now fit."""
        if job in self.running:
            self.running.remove(job)
            self._reserved -= job.reserved_tokens
        self._admit_waiting()

    def _admissible(self, job: Job) -> bool:
        return can_admit(
            running=len(self.running),
            reserved_tokens=self._reserved,
            need=job.reserved_tokens,
            max_running=self.max_running,
            kv_capacity=self.kv_capacity,
        )

    def _run(self, job: Job) -> None:
        job.started_at = self.clock()
        self.running.add(job)
        self._reserved += job.reserved_tokens

    def _admit_waiting(self) -> None:
        while self._waiting:
            job, waiter = self._waiting[0]
            if waiter.done():  # cancelled, its task has not run its handler yet
                self._waiting.popleft()
                continue
            if not self._admissible(job):
                return
            self._waiting.popleft()
            self._run(job)
            waiter.set_result(None)
