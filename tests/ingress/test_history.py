"""A streamed ingress call's dispatcher span reaches ClickHouse (chDB) with its key name as producer label,
time to first token, chunk count and tokens; history filters by the label."""

from __future__ import annotations

import time

from opentelemetry.sdk.trace import TracerProvider

from history import queries
from history.client import HistoryClient
from history.ingester import Ingester
from runtime.telemetry.spans import Identity, Outcome, record_span
from runtime.wire.contract import ChatCall, Envelope, Metadata, StreamOptions
from tests.history.conftest import ch_url, history, ingester, provider  # noqa: F401 - fixtures
from tests.support.history_spans import drain


def streamed_envelope(request_id: str, label: str) -> Envelope:
    return Envelope(
        request_id=request_id,
        producer_id="ingress-web-1",
        pool_id="gold",
        call=ChatCall.from_openai({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        enqueued_at=time.time() - 1,
        metadata=Metadata(labels={"producer": label}),
        stream=StreamOptions(include_usage=True),
    )


def test_streamed_calls_are_recorded_and_filtered_by_key_name(
    provider: TracerProvider,  # noqa: F811
    ingester: Ingester,  # noqa: F811
    history: HistoryClient,  # noqa: F811
) -> None:
    tracer = provider.get_tracer("test")
    who = Identity("ing", "gw", "d1")
    now = time.time()
    for request_id, label in (("r-alice", "alice"), ("r-bob", "bob")):
        outcome = Outcome(
            "ok", now - 0.5, now, input_tokens=3, output_tokens=20, time_to_first_token_s=0.12, chunk_count=21
        )
        record_span(tracer, streamed_envelope(request_id, label), who, outcome)
    provider.force_flush()
    drain(ingester)
    page = queries.executions_recent(client=history, filters=queries.ExecutionFilter(producer="alice"))
    assert [row["request_id"] for row in page.rows] == ["r-alice"]
    row = page.rows[0]
    assert row["producer_label"] == "alice" and row["producer"] == "ingress-web-1"
    assert row["time_to_first_token_s"] == 0.12 and row["chunk_count"] == 21
    assert row["output_tokens"] == 20
    assert "alice" in queries.filter_choices(client=history)["producer"]
