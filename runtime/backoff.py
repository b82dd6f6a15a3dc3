"""Capped exponential backoff with jitter: the one retry pause of the runtime.

Every loop that retries Valkey (the dispatcher's rounds, a reply's delivery, the config listener,
the producer's reply pump) waits ``next()`` seconds between attempts and calls ``reset()`` once an
attempt succeeds. The jitter keeps many processes that lost Valkey at the same moment from
reconnecting in lockstep; half of each delay is kept, so a retry never comes sooner than
``initial_s / 2``.

A Valkey failing over behind Sentinel is the exception: the sentinels answer but name no primary yet,
or the old primary refuses the connection (it died) or calls itself a replica. The new primary is
then seconds away, and a doubled pause would outlast it (bench/RESULTS.md, issue 21): ``next(
failing_over=True)`` pauses ``FAILOVER_PAUSE_S`` (jittered) instead, for at most ``failover_window_s``
in all before the capped backoff takes over again. A Valkey that does not answer at all never gets
there: its errors are timeouts.
"""

from __future__ import annotations

import random

FAILOVER_PAUSE_S = 0.2
FAILOVER_WINDOW_S = 5.0  # the default Valkey health window: a failover taking longer is an outage


class Backoff:
    def __init__(
        self,
        initial_s: float,
        max_s: float,
        *,
        rng: random.Random | None = None,
        failover_window_s: float = FAILOVER_WINDOW_S,
    ) -> None:
        if not 0 < initial_s <= max_s:
            raise ValueError(f"backoff needs 0 < initial_s <= max_s, got {initial_s} and {max_s}")
        self.initial_s = initial_s
        self.max_s = max_s
        self._rng = rng or random.Random()
        self._ceiling = initial_s
        self.failover_window_s = failover_window_s
        self._failover_left = failover_window_s

    def __repr__(self) -> str:
        return f"<Backoff ceiling={self._ceiling:g}s of {self.initial_s:g}..{self.max_s:g}s>"

    def next(self, *, failing_over: bool = False) -> float:
        """The pause before the next attempt: between half and all of the current ceiling, which
        then doubles up to ``max_s``; while ``failing_over`` (and the window lasts), a short fixed one."""
        if failing_over and self._failover_left > 0:
            pause = FAILOVER_PAUSE_S / 2 + self._rng.uniform(0, FAILOVER_PAUSE_S / 2)
            self._failover_left -= pause
            return pause
        ceiling = self._ceiling
        self._ceiling = min(ceiling * 2, self.max_s)
        return ceiling / 2 + self._rng.uniform(0, ceiling / 2)

    def reset(self) -> None:
        """An attempt succeeded: the next failure starts again from ``initial_s``."""
        self._ceiling = self.initial_s
        self._failover_left = self.failover_window_s
