"""``/metrics`` of the simulator: one serving engine's gauge names (vLLM, SGLang, llama.cpp or TGI), read
from live state at each scrape."""

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
    """The engine gauges and token counters under one serving engine's names, as that server writes
    them: each name with its HELP text; ``kv_usage`` None for a server without a KV-cache gauge (TGI);
    ``labelled``: samples carry ``model_name`` (vLLM, SGLang) or no label at all (llama.cpp, TGI)."""

    running: tuple[str, str]
    waiting: tuple[str, str]
    kv_usage: tuple[str, str] | None
    labelled: bool = True
    # Counter families (prometheus_client adds ``_total``); None: the server's counter is not mimicked.
    prompt_tokens: tuple[str, str] | None = None
    generated_tokens: tuple[str, str] | None = None


def _engine(kind: str, running: str, waiting: str, kv: str) -> GaugeNames:
    return GaugeNames(
        (running, "Number of requests currently running."),
        (waiting, "Number of requests waiting to run."),
        (kv, "KV-cache usage, 0..1 (1 = full)."),
        prompt_tokens=(f"{kind}:prompt_tokens", "Prompt tokens processed."),
        generated_tokens=(f"{kind}:generation_tokens", "Generation tokens produced."),
    )


# Kind "openai" has no entry: a plain OpenAI-compatible server (Ollama, a hosted API) has no /metrics.
GAUGE_NAMES = {
    "vllm": _engine(
        "vllm", "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"
    ),
    "sglang": _engine("sglang", "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"),
    # llama-server --metrics (its README's /metrics section); no labels.
    "llamacpp": GaugeNames(
        ("llamacpp:requests_processing", "Number of requests processing."),
        ("llamacpp:requests_deferred", "Number of requests deferred."),
        ("llamacpp:kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage."),
        labelled=False,
        prompt_tokens=("llamacpp:prompt_tokens", "Number of prompt tokens processed."),
        generated_tokens=("llamacpp:tokens_predicted", "Number of generation tokens processed."),
    ),
    # Text Generation Inference (its metrics reference); no labels, no KV-cache gauge.
    "tgi": GaugeNames(
        ("tgi_batch_current_size", "Current batch size"),
        ("tgi_queue_size", "Current queue size"),
        None,
        labelled=False,
    ),
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
        self.names = GAUGE_NAMES.get(kind)  # None: the kind exports no engine metrics
        self.model = model
        self.engine = engine
        self.counters = counters

    def collect(self) -> Iterator[Metric]:
        if self.names is not None:
            yield from self._engine_metrics(self.names)
        c = self.counters
        completions = CounterMetricFamily(
            "sim_completions", "Chat completions answered with 200.", labels=["model_name"]
        )
        completions.add_metric([self.model], c.completions_total)
        yield completions
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

    def _engine_metrics(self, names: GaugeNames) -> Iterator[Metric]:
        labels, values = (["model_name"], [self.model]) if names.labelled else ([], [])
        gauges = [(names.running, float(self.engine.running)), (names.waiting, float(self.engine.waiting))]
        if names.kv_usage is not None:
            gauges.append((names.kv_usage, self.engine.kv_usage()))
        for (name, doc), value in gauges:
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric(values, value)
            yield gauge
        c = self.counters
        for spec, total in (
            (names.prompt_tokens, c.prompt_tokens_total),
            (names.generated_tokens, c.completion_tokens_total),
        ):
            if spec is not None:
                counter = CounterMetricFamily(spec[0], spec[1], labels=labels)
                counter.add_metric(values, total)
                yield counter


def registry_for(collector: SimulatorCollector) -> CollectorRegistry:
    """A registry of this server's own (never the process-global one: tests run several servers)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
