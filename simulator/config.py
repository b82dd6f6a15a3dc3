"""The simulator's frozen configuration and its validation."""

from __future__ import annotations

import math
from dataclasses import dataclass

# The names /metrics exports; "openai" serves no /metrics at all (a plain OpenAI-compatible server).
KINDS = ("vllm", "sglang", "llamacpp", "tgi", "openai")


def _non_negative(value: float) -> bool:
    return value >= 0 and math.isfinite(value)


@dataclass(frozen=True)
class SimulatorConfig:
    """How the simulated backend behaves.

    Timing of a call, once it runs: ``latency_ms * exp(N(0, latency_sigma))`` (a lognormal whose
    median is ``latency_ms``; sigma 0 means fixed) plus ``ttft_ms`` until the first token, then one
    token every ``itl_ms`` (or every ``1 / tokens_per_second``; set one of the two). ``max_running``
    calls run at once (0 = unlimited) and, like vLLM, only while the KV cache can hold their prompt
    and completion tokens (``kv_cache_tokens``; 0 = unlimited); the rest wait in FIFO order.

    Faults: with probability ``rate_limit_rate`` a call is refused at once with 429 and a
    ``Retry-After: retry_after_s`` header; with probability ``hang_rate`` it takes its running slot
    and never answers until the client disconnects; with probability ``error_rate`` it fails after
    its latency with a status drawn from ``error_statuses``. ``kind`` picks the metric names of
    ``/metrics`` (vLLM's, SGLang's, llama.cpp's or TGI's; ``openai``: no ``/metrics``, a 404).
    """

    model: str = "sim-model"
    kind: str = "vllm"
    latency_ms: float = 0.0
    latency_sigma: float = 0.0
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    tokens_per_second: float = 0.0
    default_completion_tokens: int = 16
    error_rate: float = 0.0
    error_statuses: tuple[int, ...] = (500, 503)
    rate_limit_rate: float = 0.0
    retry_after_s: int = 1
    hang_rate: float = 0.0
    max_running: int = 0
    kv_cache_tokens: int = 0
    seed: int | None = None
    max_body_bytes: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        problems = [*self._timing_problems(), *self._fault_problems()]
        if not self.model:
            problems.append("model must not be empty")
        if self.kind not in KINDS:
            problems.append(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.default_completion_tokens < 0:
            problems.append(f"default_completion_tokens must be >= 0, got {self.default_completion_tokens}")
        if self.max_running < 0:
            problems.append(f"max_running must be >= 0 (0 = unlimited), got {self.max_running}")
        if self.kv_cache_tokens < 0:
            problems.append(f"kv_cache_tokens must be >= 0 (0 = unlimited), got {self.kv_cache_tokens}")
        if self.max_body_bytes <= 0:
            problems.append(f"max_body_bytes must be > 0, got {self.max_body_bytes}")
        if problems:
            raise ValueError("; ".join(problems))

    def _timing_problems(self) -> list[str]:
        problems = [
            f"{name} must be a finite number >= 0, got {value!r}"
            for name, value in (
                ("latency_ms", self.latency_ms),
                ("latency_sigma", self.latency_sigma),
                ("ttft_ms", self.ttft_ms),
                ("itl_ms", self.itl_ms),
                ("tokens_per_second", self.tokens_per_second),
            )
            if not _non_negative(value)
        ]
        if self.itl_ms > 0 and self.tokens_per_second > 0:
            problems.append("set itl_ms or tokens_per_second, not both")
        return problems

    def _fault_problems(self) -> list[str]:
        problems = [
            f"{name} must be between 0 and 1, got {value!r}"
            for name, value in (
                ("error_rate", self.error_rate),
                ("rate_limit_rate", self.rate_limit_rate),
                ("hang_rate", self.hang_rate),
            )
            if not 0.0 <= value <= 1.0
        ]
        if not self.error_statuses or any(not 400 <= s <= 599 for s in self.error_statuses):
            problems.append(f"error_statuses must be HTTP error codes (400-599), got {self.error_statuses!r}")
        if self.retry_after_s < 0:
            problems.append(f"retry_after_s must be >= 0, got {self.retry_after_s}")
        return problems

    @property
    def token_interval_s(self) -> float:
        """Seconds between two generated tokens."""
        if self.itl_ms > 0:
            return self.itl_ms / 1000.0
        return 1.0 / self.tokens_per_second if self.tokens_per_second > 0 else 0.0
