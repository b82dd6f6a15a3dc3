"""Capped exponential backoff with jitter: the one retry pause of the runtime.

Every loop that retries Valkey (the dispatcher's rounds, a reply's delivery, the config listener,
the producer's reply pump) waits ``next()`` seconds between attempts and calls ``reset()`` once an
attempt succeeds. The jitter keeps many processes that lost Valkey at the same moment from
reconnecting in lockstep; half of each delay is kept, so a retry never comes sooner than
``initial_s / 2``.
"""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, initial_s: float, max_s: float, *, rng: random.Random | None = None) -> None:
        if not 0 < initial_s <= max_s:
            raise ValueError(f"backoff needs 0 < initial_s <= max_s, got {initial_s} and {max_s}")
        self.initial_s = initial_s
        self.max_s = max_s
        self._rng = rng or random.Random()
        self._ceiling = initial_s

    def __repr__(self) -> str:
        return f"<Backoff ceiling={self._ceiling:g}s of {self.initial_s:g}..{self.max_s:g}s>"

    def next(self) -> float:
        """The pause before the next attempt: between half and all of the current ceiling, which
        then doubles up to ``max_s``."""
        ceiling = self._ceiling
        self._ceiling = min(ceiling * 2, self.max_s)
        return ceiling / 2 + self._rng.uniform(0, ceiling / 2)

    def reset(self) -> None:
        """An attempt succeeded: the next failure starts again from ``initial_s``."""
        self._ceiling = self.initial_s
