"""``/metrics`` of the simulator: vLLM's or SGLang's gauge names, read from live state at each scrape."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class GaugeNames:
    """The engine gauges under one serving engine's names."""

    running: str
    waiting: str
    kv_usage: str


GAUGE_NAMES = {
    "vllm": GaugeNames("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"),
    "sglang": GaugeNames("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"),
}


@dataclass
class Counters:
    """What the server has seen since it started."""

    requests_by_path: dict[str, int]
    completions_total: int = 0
    errors_by_status: dict[int, int] = field(default_factory=dict)
    prompt_tokens_total: int = 0
    completion_tokens_total: int = 0


class EngineState(Protocol):
    @property
    def running(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    def kv_usage(self) -> float: ...


class SimulatorCollector(Collector):
    """Reads the engine and the counters when scraped, so every value is true at that moment."""

    def __init__(self, *, kind: str, model: str, engine: EngineState, counters: Counters) -> None:
        self.kind = kind
        self.names = GAUGE_NAMES[kind]
        self.model = model
        self.engine = engine
        self.counters = counters

    def collect(self) -> Iterator[Metric]:
        model, names, c = [self.model], self.names, self.counters
        for name, doc, value in (
            (names.running, "Number of requests currently running.", float(self.engine.running)),
            (names.waiting, "Number of requests waiting to run.", float(self.engine.waiting)),
            (names.kv_usage, "KV-cache usage, 0..1 (1 = full).", self.engine.kv_usage()),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["model_name"])
            gauge.add_metric(model, value)
            yield gauge
        for name, doc, total in (
            (f"{self.kind}:prompt_tokens", "Prompt tokens processed.", c.prompt_tokens_total),
            (f"{self.kind}:generation_tokens", "Generation tokens produced.", c.completion_tokens_total),
            ("sim_completions", "Chat completions answered with 200.", c.completions_total),
        ):
            counter = CounterMetricFamily(name, doc, labels=["model_name"])
            counter.add_metric(model, total)
            yield counter
        requests = CounterMetricFamily("sim_requests", "HTTP requests received, by path.", labels=["path"])
        for path, n in c.requests_by_path.items():
            requests.add_metric([path], n)
        yield requests
        errors = CounterMetricFamily(
            "sim_errors", "Responses with an error status, by status.", labels=["status"]
        )
        for status, n in sorted(c.errors_by_status.items()):
            errors.add_metric([str(status)], n)
        yield errors


def registry_for(collector: SimulatorCollector) -> CollectorRegistry:
    """A registry of this server's own (never the process-global one: tests run several servers)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
