"""A backend's configuration as published with each fabric group that uses it.

The Django ``pools`` app owns the ``Backend`` rows; every group publication carries the backends its
pools and its default point at, so a dispatcher reads one key and knows each backend's URL, key
variable, fleet-wide in-flight cap, load thresholds and breaker settings.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from runtime.immutable import immutable

# Each kind but openai names its load gauges in runtime.backends.metrics.METRIC_NAMES; openai: any
# OpenAI-compatible server without load metrics (Ollama, a hosted API), gated on max_in_flight and 429s.
KINDS = ("vllm", "sglang", "llamacpp", "tgi", "openai")


@immutable
class BreakerPolicy:
    """When a backend's breaker opens, how long it stays open, how many probes it tries half-open
    (configuration: :mod:`runtime.backends.breaker` applies it)."""

    failure_threshold: int = 5
    window_s: float = 30.0
    open_s: float = 10.0
    half_open_probes: int = 1

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError(f"BreakerPolicy.failure_threshold must be >= 1, got {self.failure_threshold}")
        if self.window_s <= 0:
            raise ValueError(f"BreakerPolicy.window_s must be > 0, got {self.window_s}")
        if self.open_s < 0:
            raise ValueError(f"BreakerPolicy.open_s must be >= 0, got {self.open_s}")
        if self.half_open_probes < 1:
            raise ValueError(f"BreakerPolicy.half_open_probes must be >= 1, got {self.half_open_probes}")


@immutable
class GateSettings:
    """A backend's gating settings, from its admin row (:mod:`runtime.backends.gate` applies them)."""

    max_in_flight: int
    max_waiting: int = 5
    max_kv_cache_usage: float = 0.8
    metrics_max_age_s: float = 1.0
    has_metrics: bool = True

    def __post_init__(self) -> None:
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {self.max_in_flight}")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must not be negative, got {self.max_waiting}")
        if not 0 < self.max_kv_cache_usage <= 1:
            raise ValueError(f"max_kv_cache_usage must be in (0, 1], got {self.max_kv_cache_usage}")
        if self.metrics_max_age_s <= 0:
            raise ValueError(f"metrics_max_age_s must be positive, got {self.metrics_max_age_s}")


@immutable
class BackendConfig:
    backend_id: str
    base_url: str
    name: str = ""
    api_key_env: str = ""
    kind: str = "vllm"
    max_in_flight: int = 64
    timeout_s: float = 120.0
    connect_timeout_s: float = 5.0
    metrics_url: str = ""
    load_gating: bool = True
    max_waiting: int = 5
    max_kv_cache_usage: float = 0.8
    metrics_max_age_s: float = 1.0
    metrics_timeout_s: float = 1.0  # a whole scrape, connect to last byte
    metrics_max_bytes: int = 1 << 20  # a larger /metrics body is refused unread
    breaker_failures: int = 5
    breaker_open_s: float = 10.0
    breaker_probes: int = 1

    @property
    def scrapes(self) -> bool:
        """Whether the fleet scrapes this backend's load (a kind with metrics, gating on)."""
        return self.load_gating and self.kind != "openai"

    def scrape_url(self) -> str:
        return self.metrics_url or default_metrics_url(self.base_url)

    def gate_settings(self) -> GateSettings:
        return GateSettings(
            max_in_flight=self.max_in_flight,
            max_waiting=self.max_waiting,
            max_kv_cache_usage=self.max_kv_cache_usage,
            metrics_max_age_s=self.metrics_max_age_s,
            has_metrics=self.scrapes,
        )

    def breaker_policy(self) -> BreakerPolicy:
        return BreakerPolicy(
            failure_threshold=self.breaker_failures,
            open_s=self.breaker_open_s,
            half_open_probes=self.breaker_probes,
        )


def default_metrics_url(base_url: str) -> str:
    """The server's ``/metrics`` (vLLM, SGLang, llama-server and TGI serve it at the root, beside ``/v1``)."""
    parts = urlsplit(base_url)
    return urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))
