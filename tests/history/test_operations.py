"""History records each call's operation (OpenTelemetry GenAI ``gen_ai.operation.name``): a dispatcher's
span of an embeddings or legacy completions call reaches ClickHouse (chDB) named by its operation."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace import TracerProvider

from history import queries
from history.client import HistoryClient
from history.ingester import Ingester
from runtime.telemetry import semconv
from runtime.telemetry.spans import Identity, Outcome, record_span
from runtime.wire.contract import Call, ChatCall, CompletionsCall, EmbeddingsCall, Envelope, Metadata
from tests.history.conftest import ch_url, history, ingester, provider  # noqa: F401 - fixtures
from tests.support.history_spans import drain

CALLS: dict[str, Call] = {
    "r-embed": EmbeddingsCall.from_openai({"model": "emb", "input": ["a", "b", "c"]}),
    "r-text": CompletionsCall.from_openai({"model": "lm", "prompt": "Once"}),
    "r-chat": ChatCall.from_openai({"model": "lm", "messages": [{"role": "user", "content": "hi"}]}),
}


@pytest.mark.parametrize(
    ("request_id", "operation", "name", "inputs"),
    [
        ("r-embed", "embeddings", "embeddings emb", "3"),
        ("r-text", "text_completion", "text_completion lm", "1"),
        ("r-chat", "chat", "chat lm", "1"),
    ],
)
def test_the_operation_is_recorded(
    provider: TracerProvider,  # noqa: F811
    ingester: Ingester,  # noqa: F811
    history: HistoryClient,  # noqa: F811
    request_id: str,
    operation: str,
    name: str,
    inputs: str,
) -> None:
    now = time.time()
    envelope = Envelope(request_id, "p1", "docs", CALLS[request_id], now - 1, metadata=Metadata())
    output = 0 if operation == "embeddings" else 5
    outcome = Outcome("ok", now - 0.5, now, input_tokens=3, output_tokens=output)
    record_span(provider.get_tracer("test"), envelope, Identity("g", "gw", "d1"), outcome)
    provider.force_flush()
    drain(ingester)
    detail = queries.execution_detail(client=history, request_id=request_id)
    assert detail is not None
    execution = detail["execution"]
    assert execution["name"] == name
    assert execution["attributes"][semconv.GEN_AI_OPERATION_NAME] == operation
    assert execution["attributes"][semconv.MESSAGE_COUNT] == inputs
    assert execution["output_tokens"] == output
