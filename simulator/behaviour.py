"""What happens to one chat call: drawn from the config, the request's ``sim`` hook and a seeded RNG.

No I/O and no clock: :meth:`Behaviour.plan` returns a :class:`Plan` that the server carries out.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from simulator.config import SimulatorConfig
from simulator.engine import Timing


@dataclass(frozen=True)
class Plan:
    """One call's fate. ``status`` 0 means success; ``timing`` counts from the moment it runs."""

    hang: bool
    status: int
    message: str
    latency_s: float
    completion_tokens: int
    finish: str
    timing: Timing


class Behaviour:
    """Draws each call's plan; the same seed gives the same sequence of plans."""

    def __init__(self, config: SimulatorConfig, rng: random.Random) -> None:
        self.config = config
        self.rng = rng
        # Calls seen per ``sim.key``: retries and redeliveries of one request carry the same key.
        self.calls_by_key: Counter[str] = Counter()

    def rate_limited(self) -> bool:
        """Whether the next call is refused at the door with 429."""
        return self._draw(self.config.rate_limit_rate)

    def plan(self, request: dict[str, Any], sim: dict[str, Any]) -> Plan:
        seen = 0
        if "key" in sim:
            self.calls_by_key[str(sim["key"])] += 1
            seen = self.calls_by_key[str(sim["key"])]
        latency = self._latency_s(sim)
        status, message = self._outcome(sim, seen)
        hang = bool(sim.get("hang")) or self._draw(self.config.hang_rate)
        tokens, finish = self._completion_tokens(request, sim)
        ttft_s = float(sim.get("ttft_ms", self.config.ttft_ms)) / 1000.0
        interval = float(sim["itl_ms"]) / 1000.0 if "itl_ms" in sim else self.config.token_interval_s
        # A failing call generates nothing: it holds only its prompt, and answers after its latency.
        timing = Timing(
            first_token_s=latency + ttft_s, token_interval_s=interval, tokens=0 if status else tokens
        )
        return Plan(hang, status, message, latency, tokens, finish, timing)

    def _draw(self, probability: float) -> bool:
        # Draw only when the fault is configured, so seeded runs keep their sequence without it.
        return probability > 0 and self.rng.random() < probability

    def _latency_s(self, sim: dict[str, Any]) -> float:
        if "latency_ms" in sim:
            return float(sim["latency_ms"]) / 1000.0
        base = self.config.latency_ms
        if base <= 0:
            return 0.0
        sigma = self.config.latency_sigma
        return base * (math.exp(self.rng.gauss(0.0, sigma)) if sigma > 0 else 1.0) / 1000.0

    def _outcome(self, sim: dict[str, Any], seen: int) -> tuple[int, str]:
        """(status, message) of an injected error, or (0, "") for success.

        ``fail_times`` limits a forced ``status`` to the first calls of its ``key``: a backend that
        fails a request twice and then serves it.
        """
        status = sim.get("status")
        fail_times = sim.get("fail_times")
        if status is not None and fail_times is not None and seen > int(fail_times):
            return 0, ""
        if status is not None and status >= 400:
            return status, str(sim.get("message") or f"simulated error {status}")
        if status is None and self._draw(self.config.error_rate):
            status = self.rng.choice(self.config.error_statuses)
            return status, f"simulated error {status} (error_rate={self.config.error_rate})"
        return 0, ""

    def _completion_tokens(self, request: dict[str, Any], sim: dict[str, Any]) -> tuple[int, str]:
        wanted = sim.get("completion_tokens", self.config.default_completion_tokens)
        limit = request.get("max_completion_tokens") or request.get("max_tokens")
        if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < wanted:
            return limit, "length"
        return wanted, "stop"
