"""A backend's load, read from its Prometheus ``/metrics`` text (vLLM or SGLang names).

Pure: :func:`parse_load` turns the text of one scrape into a :class:`BackendLoad`; fetching it is
the scraper's job (:mod:`runtime.backends.scraper`). Parsing uses ``prometheus_client``'s own parser,
so label sets, escaping and comments are read as Prometheus reads them. A server with several
models (or data-parallel ranks) reports one sample per label set: they are summed, and the KV-cache
usage is the highest of them (the fullest engine is the one that queues first).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import orjson
from prometheus_client.parser import text_string_to_metric_families

from runtime.errors import MalformedEnvelope

__all__ = ["METRIC_NAMES", "BackendLoad", "MetricNames", "parse_load"]


@dataclass(frozen=True, slots=True)
class MetricNames:
    """The three gauges gating reads, under one serving engine's names."""

    running: str
    waiting: str
    kv_usage: str


METRIC_NAMES: dict[str, MetricNames] = {
    "vllm": MetricNames("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"),
    "sglang": MetricNames("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"),
}


@dataclass(frozen=True, slots=True)
class BackendLoad:
    """One scrape of one backend, as shared through Valkey.

    ``scraped_at`` is wall-clock seconds (every process of the fleet compares it with its own clock).
    ``in_flight_at_scrape`` is how many of our calls were in flight to the backend when the metrics
    were read: the gate counts launches made since then as already waiting. ``error`` is empty when
    the scrape succeeded; a failed scrape keeps the time so the dashboard can say since when.
    """

    backend_id: str
    scraped_at: float
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    in_flight_at_scrape: int = 0
    error: str = ""
    scrape_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.error

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes | str) -> BackendLoad:
        try:
            return cls(**orjson.loads(raw))
        except (orjson.JSONDecodeError, TypeError) as exc:
            raise MalformedEnvelope(f"shared backend load is unreadable: {exc}") from exc


def parse_load(text: str, *, kind: str, backend_id: str, scraped_at: float) -> BackendLoad:
    """The load in one ``/metrics`` text; raises ValueError when the text lacks the kind's gauges."""
    names = METRIC_NAMES.get(kind)
    if names is None:
        raise ValueError(f"backend kind {kind!r} exports no load metrics (known: {', '.join(METRIC_NAMES)})")
    found: dict[str, list[float]] = {names.running: [], names.waiting: [], names.kv_usage: []}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in found:
                    found[sample.name].append(float(sample.value))
    except ValueError as exc:
        raise ValueError(f"unreadable Prometheus text: {exc}") from exc
    missing = [name for name, values in found.items() if not values]
    if missing:
        raise ValueError(f"the metrics lack {', '.join(missing)} (is the backend kind {kind!r} right?)")
    return BackendLoad(
        backend_id=backend_id,
        scraped_at=scraped_at,
        running=round(sum(found[names.running])),
        waiting=round(sum(found[names.waiting])),
        kv_usage=max(found[names.kv_usage]),
    )
