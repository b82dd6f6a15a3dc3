"""OpenTelemetry SDK set-up: spans leave the process through a bounded Valkey stream.

Producer and dispatcher create spans with the plain OpenTelemetry API; :func:`configure_tracing`
installs the SDK behind it. Each finished span is queued in a bounded :class:`BatchSpanProcessor`
(the hot path only appends; when full the oldest span is dropped and counted) and exported by a
background thread to :class:`ValkeyStreamSpanExporter`, which XADDs one compact JSON entry per span to
``keys.span_stream()``. The history ingester (``history.ingester``) reads that stream with a consumer
group and batch-inserts into ClickHouse.

Trim accounting: the stream is capped at ``maxlen`` (approximate MAXLEN). The ingester removes what it
has acknowledged (``XTRIM MINID`` up to its oldest pending entry), so every entry the exporter's cap
removes was never stored: the exporter adds XTRIM's deleted count to ``keys.span_trim_counter()``.
Export failures (Valkey down) are counted on the exporter and logged, never raised.

Prompt and completion text are stored only when ``store_content=True`` is passed; the dispatcher
asks :func:`store_content` (a module-level getter for the flag of the last configured provider).

Optionally (``otlp=True``, which callers set when :func:`otlp_configured` finds
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` in their environment), spans
are also sent to that collector over OTLP/HTTP; the OTLP exporter reads its endpoint, headers, timeout
and TLS settings from the ``OTEL_EXPORTER_OTLP_*`` variables itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import redis
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.environment_variables import OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Sampler
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from runtime.queue.keys import SPAN_STREAM_MAXLEN, KeySpace
from runtime.queue.scripts import SPANS_ADD
from runtime.telemetry.span_json import encode_span
from runtime.valkey.sync import sync_connect

log = logging.getLogger(__name__)
_propagator = TraceContextTextMapPropagator()
_store_content = False

SPAN_FIELD = "span"
"""The stream entry's single field; its value is the span's JSON."""


class ValkeyStreamSpanExporter(SpanExporter):
    """Exports spans into the bounded span stream; counts (never raises) failures."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        keys: KeySpace,
        maxlen: int = SPAN_STREAM_MAXLEN,
        log_every_s: float = 30.0,
    ) -> None:
        self.client = client
        self.keys = keys
        self.maxlen = maxlen
        self.exported = 0
        self.failed = 0
        self.trimmed = 0
        self._script = client.register_script(SPANS_ADD)
        self._log_every_s = log_every_s
        self._last_log = float("-inf")
        self._shutdown = False

    def __repr__(self) -> str:
        return (
            f"<ValkeyStreamSpanExporter {self.keys.span_stream()} exported={self.exported} "
            f"failed={self.failed} trimmed={self.trimmed}>"
        )

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown or not spans:
            return SpanExportResult.SUCCESS
        payloads = []
        for span in spans:
            try:
                payloads.append(encode_span(span))
            except Exception as exc:  # e.g. an int attribute beyond 64 bits: this span alone is lost
                self.failed += 1
                self._warn("a span did not encode", exc)
        if not payloads:
            return SpanExportResult.FAILURE
        try:
            deleted = self._script(
                keys=[self.keys.span_stream(), self.keys.span_trim_counter()], args=[*payloads, self.maxlen]
            )
        except Exception as exc:  # Valkey down or a timeout: count, never raise
            self.failed += len(payloads)
            self._warn("span export to Valkey failed", exc)
            return SpanExportResult.FAILURE
        self.exported += len(payloads)
        self.trimmed += int(deleted or 0)
        return SpanExportResult.SUCCESS if len(payloads) == len(spans) else SpanExportResult.FAILURE

    def _warn(self, what: str, exc: Exception) -> None:
        """At most one warning every ``log_every_s``: an outage fails every export."""
        now = time.monotonic()
        if now - self._last_log >= self._log_every_s:
            self._last_log = now
            log.warning("%s (%d spans lost so far): %s", what, self.failed, exc)

    def shutdown(self) -> None:
        self._shutdown = True
        self.client.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


# The SDK's own count of processed spans; drops carry error.type="queue_full" (semantic conventions).
PROCESSED_SPANS_METRIC = "otel.sdk.processor.span.processed"
_QUEUE_FULL = "queue_full"
_environ_lock = threading.Lock()


@contextlib.contextmanager
def _sdk_internal_metrics() -> Iterator[None]:
    """Switches the SDK's self-observability metrics on while a processor is built.

    The SDK reads this switch only from the process environment, when the processor is constructed;
    setting it for good would also make every TracerProvider count started spans on the hot path.
    """
    with _environ_lock:
        saved = os.environ.get(OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED)
        os.environ[OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED] = "true"
        try:
            yield
        finally:
            if saved is None:
                del os.environ[OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED]
            else:
                os.environ[OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED] = saved


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """The SDK batch processor, plus the count of spans it dropped because its queue was full.

    The count is the SDK's own ``otel.sdk.processor.span.processed`` metric with
    ``error.type=queue_full``, recorded into a meter provider private to this processor and read back on
    demand: no private field of the SDK is touched.
    """

    def __init__(self, exporter: SpanExporter, *, max_queue_size: int, **kwargs: Any) -> None:
        self._metrics = InMemoryMetricReader()
        meter_provider = MeterProvider(metric_readers=[self._metrics], shutdown_on_exit=False)
        with _sdk_internal_metrics():
            super().__init__(exporter, max_queue_size=max_queue_size, meter_provider=meter_provider, **kwargs)
        self.max_queue_size = max_queue_size

    @property
    def dropped(self) -> int:
        data = self._metrics.get_metrics_data()
        scopes = [scope for r in data.resource_metrics for scope in r.scope_metrics] if data else []
        points = [
            point
            for scope in scopes
            for metric in scope.metrics
            if metric.name == PROCESSED_SPANS_METRIC
            for point in metric.data.data_points
        ]
        return sum(
            int(p.value)
            for p in points
            if isinstance(p, NumberDataPoint) and (p.attributes or {}).get("error.type") == _QUEUE_FULL
        )

    def on_end(self, span: ReadableSpan) -> None:
        try:
            super().on_end(span)
        except Exception:  # never into the caller's hot path
            log.exception("span processor failed")


class SampledSpanProcessor(SpanProcessor):
    """Hands ``inner`` only the spans ``sampler`` keeps, asked once a span ends (its parent, trace id,
    name, kind, attributes and links: a ratio or parent-based sampler decides as it would have at the
    start).

    The provider records every span, because history is the record of every call. What an
    ``OTEL_TRACES_SAMPLER`` asks for (a ratio, or the parent's "not sampled") then applies to what an
    OTLP collector gets, where it is meant to, and not to history.
    """

    def __init__(self, inner: SpanProcessor, sampler: Sampler) -> None:
        self.inner = inner
        self.sampler = sampler

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.get_span_context()
        if ctx is None:
            return
        parent = trace.set_span_in_context(trace.NonRecordingSpan(span.parent)) if span.parent else None
        result = self.sampler.should_sample(
            parent, ctx.trace_id, span.name, span.kind, span.attributes, list(span.links)
        )
        if result.decision.is_sampled():
            self.inner.on_end(span)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def env_sampler() -> Sampler:
    """The sampler the SDK builds from ``OTEL_TRACES_SAMPLER`` (and its argument), or its default."""
    return TracerProvider(shutdown_on_exit=False).sampler


def otlp_configured(environ: Mapping[str, str]) -> bool:
    """Whether the environment names an OTLP collector for traces (the exporter reads the rest itself)."""
    return any(
        environ.get(name, "").strip()
        for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def configure_tracing(
    *,
    redis_url: str,
    keys: KeySpace,
    service_name: str,
    maxlen: int = SPAN_STREAM_MAXLEN,
    otlp: bool = False,
    store_content: bool = False,
    resource_attributes: Mapping[str, str] | None = None,
    max_queue_size: int = 8192,
    max_export_batch_size: int = 512,
    schedule_delay_millis: float = 500,
    install_global: bool = True,
) -> TracerProvider:
    """Builds (and by default installs as the global provider) an SDK TracerProvider for this process.

    ``otlp`` also exports to an OpenTelemetry collector over OTLP/HTTP, configured by the process's
    ``OTEL_EXPORTER_OTLP_*`` variables (callers pass ``otlp_configured(os.environ)``).
    The provider carries ``store_content`` and ``span_exporter`` / ``span_processor`` attributes. The
    global provider can be set only once per process (an OpenTelemetry rule): tests pass
    ``install_global=False`` and take tracers from the returned provider.
    """
    global _store_content
    attributes: dict[str, Any] = {
        "service.name": service_name,
        "service.instance.id": f"{socket.gethostname()}-{os.getpid()}",
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "opentelemetry",
        **(resource_attributes or {}),
    }
    # Every span is recorded, whatever the parent's flag or OTEL_TRACES_SAMPLER: history must hold every
    # call (counts, costs, the what-if replay). The sampler they ask for thins only the OTLP export.
    provider = TracerProvider(resource=Resource(attributes), sampler=ALWAYS_ON)
    client = sync_connect(redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)
    exporter = ValkeyStreamSpanExporter(client, keys=keys, maxlen=maxlen)
    processor = CountingBatchSpanProcessor(
        exporter,
        max_queue_size=max_queue_size,
        max_export_batch_size=max_export_batch_size,
        schedule_delay_millis=schedule_delay_millis,
    )
    provider.add_span_processor(processor)
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        otlp_processor = BatchSpanProcessor(OTLPSpanExporter(), max_queue_size=max_queue_size)
        provider.add_span_processor(SampledSpanProcessor(otlp_processor, env_sampler()))
        log.info("tracing: also exporting spans over OTLP/HTTP (OTEL_EXPORTER_OTLP_* settings)")
    provider.store_content = store_content  # type: ignore[attr-defined]
    provider.span_exporter = exporter  # type: ignore[attr-defined]
    provider.span_processor = processor  # type: ignore[attr-defined]
    _store_content = store_content
    if install_global:
        trace.set_tracer_provider(provider)
    return provider


def store_content() -> bool:
    """Whether spans may carry prompt/completion text (``gen_ai.input.messages`` / ``output.messages``).

    The flag of the most recently configured provider; False when tracing was never configured.
    """
    return _store_content


def shutdown_tracing(provider: TracerProvider, timeout_s: float = 5.0) -> None:
    """Flushes queued spans and stops the exporters, giving up after ``timeout_s``; never raises."""
    done = threading.Event()

    def _shutdown() -> None:
        try:
            provider.force_flush(timeout_millis=int(timeout_s * 1000))
            provider.shutdown()
        except Exception:
            log.exception("tracing shutdown failed")
        finally:
            done.set()

    worker = threading.Thread(target=_shutdown, name="tracing-shutdown", daemon=True)
    worker.start()
    if not done.wait(timeout_s):
        log.warning("tracing shutdown did not finish within %.1fs; queued spans may be lost", timeout_s)


def span_carrier(span: trace.Span) -> dict[str, str]:
    """The W3C trace context of ``span`` as ``TraceContextTextMapPropagator.inject`` writes it, without
    the context it would build and read back per call (every submit asks: bench/RESULTS.md, issue 23
    session 9)."""
    ctx = span.get_span_context()
    if ctx == trace.INVALID_SPAN_CONTEXT:
        return {}
    carrier = {"traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"}
    if ctx.trace_state:
        carrier["tracestate"] = ctx.trace_state.to_header()
    return carrier


def span_from_context(trace_carrier: Mapping[str, str] | None) -> Context:
    """The parent context carried in an envelope's W3C ``trace`` mapping (an empty context if none)."""
    try:
        carrier = {str(k): str(v) for k, v in (trace_carrier or {}).items()}
        return _propagator.extract(carrier=carrier)
    except Exception:  # a malformed carrier must not stop a dispatch
        return Context()
