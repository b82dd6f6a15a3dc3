"""The spans a real dispatch produces, captured by the real OpenTelemetry SDK (in-memory exporter)."""

from __future__ import annotations

import orjson
import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from runtime.producer import Producer
from runtime.telemetry import semconv
from runtime.telemetry.tracing import span_carrier
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatching import CALL, one_pool_group, running_dispatcher


@pytest.mark.parametrize("store_content", [False, True])
async def test_dispatch_span_is_a_child_of_the_submit_span(aredis, keys, spans, store_content) -> None:
    provider, exporter = spans
    async with SimulatorServer(SimulatorConfig()) as sim:
        config = one_pool_group("http://user:hunter2@" + sim.url.removeprefix("http://"))
        async with (
            running_dispatcher(
                aredis, keys, config, tracer=provider.get_tracer("d"), store_content=store_content
            ),
            Producer(aredis, keys=keys, tracer=provider.get_tracer("p")) as producer,
        ):
            result = await producer.submit(CALL, pool_id="default", timeout=10)
    by_role = {s.attributes[semconv.SPAN_KIND_ROLE]: s for s in exporter.get_finished_spans()}
    submit, dispatch = by_role["producer"], by_role["dispatcher"]
    assert dispatch.context.trace_id == submit.context.trace_id
    assert dispatch.parent is not None and dispatch.parent.span_id == submit.context.span_id
    attrs = dispatch.attributes
    assert attrs[semconv.REQUEST_ID] == result.request_id == submit.attributes[semconv.REQUEST_ID]
    assert attrs[semconv.POOL_ID] == "default" and attrs[semconv.GROUP_ID] == "g"
    assert attrs[semconv.STATUS] == "ok" and attrs[semconv.REPLY_DELIVERED] is True
    assert attrs[semconv.GEN_AI_REQUEST_MODEL] == "sim-model"
    assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == result.completion["usage"]["completion_tokens"]
    assert attrs[semconv.QUEUE_WAIT_S] + attrs[semconv.EXECUTION_S] <= attrs[semconv.TOTAL_S] + 1e-6
    assert "hunter2" not in str(dict(attrs)) and attrs[semconv.SERVER_ADDRESS] == "127.0.0.1"
    if store_content:
        assert orjson.loads(attrs[semconv.GEN_AI_INPUT_MESSAGES]) == CALL["messages"]
        assert orjson.loads(attrs[semconv.GEN_AI_OUTPUT_MESSAGES])[0]["role"] == "assistant"
    else:
        assert semconv.GEN_AI_INPUT_MESSAGES not in attrs and semconv.GEN_AI_OUTPUT_MESSAGES not in attrs


def test_the_envelopes_trace_context_is_what_the_w3c_propagator_injects(spans) -> None:
    provider, _ = spans
    tracer = provider.get_tracer("p")
    propagator = TraceContextTextMapPropagator()
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_state=TraceState([("vendor", "v1")]))
    unsampled = SpanContext(0x123, 0x456, is_remote=True, trace_flags=TraceFlags(0))
    made = [tracer.start_span("sdk"), trace.NonRecordingSpan(remote), trace.NonRecordingSpan(unsampled)]
    for span in [*made, trace.INVALID_SPAN]:
        injected: dict[str, str] = {}
        propagator.inject(injected, context=trace.set_span_in_context(span))
        assert span_carrier(span) == injected
    assert span_carrier(made[1])["tracestate"] == "vendor=v1"
    assert span_carrier(made[2])["traceparent"].endswith("-00")
    assert span_carrier(trace.INVALID_SPAN) == {}
