"""Cost served per tenant in about the last minute, from the cumulative ``hash:llm:tenant-served:{pool}``.

The queue keeps only a running total per tenant (adding a per-minute bucket would put another write
in every claim and correction), so the web process keeps a few earlier reads of it and shows the
difference with the one from about :data:`SPAN_S` ago, scaled to a minute. Memory is bounded: at most
:data:`KEEP` samples per pool, each holding only the tenants that read listed (backlogged or in flight).
No I/O, no clock: callers pass ``now``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping

__all__ = ["EVERY_S", "KEEP", "SPAN_S", "ServedWindow"]

SPAN_S = 60.0
EVERY_S = 10.0  # a new sample at most this often, so KEEP samples reach back past SPAN_S
KEEP = 8
MIN_SPAN_S = 1.0  # a baseline younger than this says nothing yet


class ServedWindow:
    """Per pool, the earlier reads of the served hash; one per web process (reads come from threads)."""

    def __init__(self, *, span_s: float = SPAN_S, every_s: float = EVERY_S, keep: int = KEEP) -> None:
        self.span_s, self.every_s, self.keep = span_s, every_s, keep
        self._samples: dict[str, deque[tuple[float, dict[str, float]]]] = {}
        self._lock = threading.Lock()

    def per_minute(self, pool_id: str, now: float, served: Mapping[str, float]) -> dict[str, float | None]:
        """Each tenant's cost served per minute since the kept read nearest ``span_s`` ago (None: no
        earlier read of it yet); keeps this read when the last kept one is ``every_s`` old."""
        with self._lock:
            samples = self._samples.setdefault(pool_id, deque(maxlen=self.keep))
            base = self._baseline(samples, now)
            if not samples or now - samples[-1][0] >= self.every_s:
                samples.append((now, dict(served)))
        if base is None:
            return dict.fromkeys(served)
        at, before = base
        scale = 60.0 / (now - at)
        return {
            tenant: None if tenant not in before else max(0.0, (value - before[tenant]) * scale)
            for tenant, value in served.items()
        }

    def _baseline(
        self, samples: deque[tuple[float, dict[str, float]]], now: float
    ) -> tuple[float, dict[str, float]] | None:
        """The newest sample at least ``span_s`` old, else the oldest one (the process just started)."""
        usable = [s for s in samples if now - s[0] >= MIN_SPAN_S]
        if not usable:
            return None
        old_enough = [s for s in usable if now - s[0] >= self.span_s]
        return old_enough[-1] if old_enough else usable[0]
