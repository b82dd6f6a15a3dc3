"""runtime.telemetry.tracing: a real SDK tracer exporting into a real Valkey stream."""

from __future__ import annotations

import http.server
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import orjson
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.environment_variables import OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runtime.queue.keys import KeySpace
from runtime.telemetry import span_json, tracing
from runtime.telemetry.span_json import scrub_text
from runtime.telemetry.tracing import (
    CountingBatchSpanProcessor,
    configure_tracing,
    otlp_configured,
    shutdown_tracing,
    span_from_context,
)


def _entries(sredis: redis.Redis, keys: KeySpace) -> list[dict]:
    return [orjson.loads(f[b"span"]) for _, f in sredis.xrange(keys.span_stream())]


def test_span_is_one_compact_json_entry(
    provider: TracerProvider, sredis: redis.Redis, keys: KeySpace
) -> None:
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("parent", kind=trace.SpanKind.PRODUCER) as parent:
        span = tracer.start_span("chat m", kind=trace.SpanKind.CLIENT, attributes={"a": 1, "b": [1, 2]})
        span.set_status(trace.Status(trace.StatusCode.ERROR, "boom"))
        span.end()
    provider.force_flush()
    docs = {d["name"]: d for d in _entries(sredis, keys)}
    child, par = docs["chat m"], docs["parent"]
    assert child["trace_id"] == par["trace_id"] == format(parent.get_span_context().trace_id, "032x")
    assert child["parent_span_id"] == par["span_id"] and par["parent_span_id"] == ""
    assert child["kind"] == "Client" and par["kind"] == "Producer"
    assert child["status_code"] == "Error" and child["status_message"] == "boom"
    assert child["attributes"] == {"a": 1, "b": [1, 2]}
    assert child["resource"]["service.name"] == "llm-dispatch-dispatcher"
    assert child["scope"]["name"] == "test"
    assert child["end_ns"] >= child["start_ns"] > 0


def test_context_round_trip_through_envelope_carrier(provider: TracerProvider) -> None:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    tracer = provider.get_tracer("test")
    parent = tracer.start_span("submit")
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(parent))
    child = tracer.start_span("chat m", context=span_from_context(carrier))
    assert child.get_span_context().trace_id == parent.get_span_context().trace_id
    assert child.parent is not None and child.parent.span_id == parent.get_span_context().span_id


@pytest.mark.parametrize("carrier", [None, {}, {"traceparent": "garbage"}, {"traceparent": 5}])
def test_span_from_bad_carrier_is_an_empty_context(carrier: object) -> None:
    ctx = span_from_context(carrier)  # type: ignore[arg-type]
    assert isinstance(ctx, Context)
    assert not trace.get_current_span(ctx).get_span_context().is_valid


def test_exporter_scrubs_credentials(provider: TracerProvider, sredis: redis.Redis, keys: KeySpace) -> None:
    span = provider.get_tracer("test").start_span(
        "chat m", attributes={"url": "https://bob:hunter2@llm.example/v1?api_key=zzz&x=1", "n": "plain"}
    )
    span.set_status(trace.Status(trace.StatusCode.ERROR, "POST https://bob:hunter2@llm.example/v1 failed"))
    span.end()
    provider.force_flush()
    raw = b"".join(f[b"span"] for _, f in sredis.xrange(keys.span_stream()))
    assert b"hunter2" not in raw and b"zzz" not in raw and b"bob" not in raw
    assert b"llm.example/v1" in raw


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no url here", "no url here"),
        ("http://host:80/v1", "http://host:80/v1"),
        ("see https://u:p@h/x and http://h2/?token=t", "see https://h/x and http://h2/?token=***"),
        ("https://h/?api-version=1", "https://h/?api-version=1"),
    ],
)
def test_scrub_text(text: str, expected: str) -> None:
    assert scrub_text(text) == expected


def test_trimming_is_counted(valkey_url: str, sredis: redis.Redis, keys: KeySpace) -> None:
    tp = configure_tracing(
        redis_url=valkey_url,
        keys=keys,
        service_name="s",
        maxlen=10,
        install_global=False,
        schedule_delay_millis=10,
    )
    tracer = tp.get_tracer("test")
    for i in range(450):
        tracer.start_span(f"s{i}").end()
    tp.force_flush()
    shutdown_tracing(tp, 2.0)
    trimmed = int(sredis.get(keys.span_trim_counter()) or 0)
    assert trimmed > 0
    assert trimmed + sredis.xlen(keys.span_stream()) == 450
    assert tp.span_exporter.trimmed == trimmed  # type: ignore[attr-defined]


def test_a_span_that_does_not_encode_is_lost_alone(
    valkey_url: str, sredis: redis.Redis, keys: KeySpace
) -> None:
    """An int attribute beyond 64 bits (the SDK keeps it; JSON here cannot carry it) is one lost span,
    counted: the spans exported with it in the same batch reach the stream."""
    exporter = tracing.ValkeyStreamSpanExporter(sredis, keys=keys)
    provider = TracerProvider()
    tracer = provider.get_tracer("test")
    spans = []
    for n in (1, 2**64, 3):
        span = tracer.start_span(f"s{n}", attributes={"n": n})
        span.end()
        spans.append(span)
    assert exporter.export(spans) == SpanExportResult.FAILURE
    assert (exporter.exported, exporter.failed) == (2, 1)
    assert [doc["attributes"]["n"] for doc in _entries(sredis, keys)] == [1, 3]


def test_valkey_down_is_counted_not_raised(keys: KeySpace) -> None:
    tp = configure_tracing(
        redis_url="redis://127.0.0.1:1/0",
        keys=keys,
        service_name="s",
        install_global=False,
        schedule_delay_millis=10,
    )
    tracer = tp.get_tracer("test")
    for _ in range(5):
        tracer.start_span("x").end()  # the hot path never raises
    tp.force_flush()
    exporter = tp.span_exporter  # type: ignore[attr-defined]
    assert exporter.failed == 5 and exporter.exported == 0
    assert "failed=5" in repr(exporter)
    shutdown_tracing(tp, 1.0)


def test_bounded_queue_drops_oldest_and_counts(keys: KeySpace) -> None:
    tp = configure_tracing(
        redis_url="redis://127.0.0.1:1/0",
        keys=keys,
        service_name="s",
        install_global=False,
        max_queue_size=8,
        max_export_batch_size=8,
        schedule_delay_millis=60_000,
    )
    tracer = tp.get_tracer("test")
    for _ in range(200):
        tracer.start_span("x").end()
    assert tp.span_processor.dropped > 0  # type: ignore[attr-defined]
    shutdown_tracing(tp, 1.0)


class StuckExporter(SpanExporter):
    """Holds the processor's export thread inside export() until released."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.inside.set()
        self.release.wait(10)
        self.exported += len(spans)
        return SpanExportResult.SUCCESS


def test_dropped_spans_are_counted_exactly_through_the_sdk_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED, raising=False)
    exporter = StuckExporter()
    processor = CountingBatchSpanProcessor(
        exporter, max_queue_size=8, max_export_batch_size=4, schedule_delay_millis=60_000
    )
    assert OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED not in os.environ  # switched on only while built
    tp = TracerProvider()
    tp.add_span_processor(processor)
    tracer = tp.get_tracer("test")
    for _ in range(4):  # a full batch wakes the export thread, which then hangs in export()
        tracer.start_span("x").end()
    assert exporter.inside.wait(10)
    assert processor.dropped == 0
    for _ in range(8 + 5):  # the queue holds 8; each of the next 5 pushes the oldest out
        tracer.start_span("x").end()
    assert processor.dropped == 5
    exporter.release.set()
    tp.shutdown()
    assert exporter.exported == 4 + 8


def test_store_content_flag(valkey_url: str, keys: KeySpace) -> None:
    tp = configure_tracing(
        redis_url=valkey_url, keys=keys, service_name="s", store_content=True, install_global=False
    )
    assert tracing.store_content() is True and tp.store_content is True  # type: ignore[attr-defined]
    tp2 = configure_tracing(redis_url=valkey_url, keys=keys, service_name="s", install_global=False)
    assert tracing.store_content() is False
    shutdown_tracing(tp, 1.0)
    shutdown_tracing(tp2, 1.0)


@pytest.fixture
def otlp_server() -> Iterator[tuple[str, list[str]]]:
    paths: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            paths.append(f"{self.path} tenant={self.headers.get('x-tenant')}")
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", paths
    server.shutdown()


def test_otlp_exporter_reads_its_own_environment(
    valkey_url: str,
    keys: KeySpace,
    sredis: redis.Redis,
    otlp_server: tuple[str, list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, paths = otlp_server
    assert not otlp_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": " "})
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=acme")
    tp = configure_tracing(
        redis_url=valkey_url,
        keys=keys,
        service_name="s",
        install_global=False,
        otlp=otlp_configured(os.environ),
    )
    tp.get_tracer("test").start_span("x").end()
    tp.force_flush()
    assert paths == ["/v1/traces tenant=acme"]
    assert sredis.xlen(keys.span_stream()) == 1
    shutdown_tracing(tp, 2.0)


def test_history_keeps_a_span_whose_parent_was_not_sampled(
    valkey_url: str, keys: KeySpace, sredis: redis.Redis
) -> None:
    """A request whose trace context says "not sampled" (a producer inside an application that
    samples its own traces) is still one history row: history is the record of every call."""
    tp = configure_tracing(redis_url=valkey_url, keys=keys, service_name="s", install_global=False)
    unsampled = span_from_context({"traceparent": f"00-{'a' * 32}-{'b' * 16}-00"})
    tp.get_tracer("test").start_span("chat m", context=unsampled).end()
    tp.force_flush()
    (doc,) = _entries(sredis, keys)
    assert doc["trace_id"] == "a" * 32 and doc["parent_span_id"] == "b" * 16
    shutdown_tracing(tp, 2.0)


@pytest.mark.parametrize(
    ("sampler", "parent_flags", "sent"),
    [
        ("always_off", "01", 0),
        ("always_on", "00", 1),
        ("parentbased_always_on", "00", 0),  # the SDK's default: a parent's "not sampled" holds
        ("parentbased_always_on", "01", 1),
    ],
)
def test_otel_traces_sampler_thins_what_otlp_gets_not_history(
    valkey_url: str,
    keys: KeySpace,
    sredis: redis.Redis,
    otlp_server: tuple[str, list[str]],
    monkeypatch: pytest.MonkeyPatch,
    sampler: str,
    parent_flags: str,
    sent: int,
) -> None:
    url, paths = otlp_server
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    tp = configure_tracing(redis_url=valkey_url, keys=keys, service_name="s", install_global=False, otlp=True)
    parent = span_from_context({"traceparent": f"00-{'a' * 32}-{'b' * 16}-{parent_flags}"})
    for _ in range(3):
        tp.get_tracer("test").start_span("x", context=parent).end()
    tp.force_flush()
    assert len(paths) == sent  # one OTLP batch, or none
    assert sredis.xlen(keys.span_stream()) == 3
    shutdown_tracing(tp, 2.0)


_CREDENTIAL_URLS = st.sampled_from(
    ["https://bob:hunter2@llm.example/v1", "http://h/?api_key=zzz&x=1", "http://plain.example/v1"]
)
_ATTRIBUTE_VALUES = st.one_of(
    st.text(max_size=20),
    _CREDENTIAL_URLS,
    st.builds(lambda a, url: f"{a} {url}", st.text(max_size=5), _CREDENTIAL_URLS),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),  # OpenTelemetry's int is 64 bits
    st.floats(allow_nan=False, allow_infinity=False),  # JSON has neither (orjson writes null)
    st.booleans(),
    st.lists(st.one_of(st.text(max_size=5), _CREDENTIAL_URLS), max_size=3),
    st.lists(st.integers(min_value=0, max_value=2**63 - 1), max_size=3),
)


@settings(max_examples=200, deadline=None)
@given(
    attributes=st.dictionaries(st.text(min_size=1, max_size=8), _ATTRIBUTE_VALUES, max_size=8),
    service=st.sampled_from(["one", "two https://u:p@h/x"]),
)
def test_encoded_attributes_and_resource_are_each_value_scrubbed(attributes: dict, service: str) -> None:
    """What ``encode_span`` writes of a span's attributes and its resource: each value as the SDK
    stored it (sequences as lists), every credential URL redacted; the resource of the span's own
    provider, though the encoder keeps the last resource it met."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.get_tracer("test").start_span("chat m", attributes=attributes).end()
    (span,) = exporter.get_finished_spans()
    doc = orjson.loads(span_json.encode_span(span))

    def expected(values: Any) -> dict[str, Any]:
        return {
            str(k): [scrub_text(x) if isinstance(x, str) else x for x in v]
            if isinstance(v, tuple)
            else (scrub_text(v) if isinstance(v, str) else v)
            for k, v in values.items()
        }

    assert doc["attributes"] == expected(span.attributes)
    assert doc["resource"] == expected(span.resource.attributes)
    assert doc["resource"]["service.name"] == scrub_text(service)
    raw = orjson.dumps(doc)
    assert b"hunter2" not in raw and b"zzz" not in raw
