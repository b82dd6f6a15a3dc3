"""Span stream -> ClickHouse: real SDK spans, real Valkey stream, real chDB engine."""

from __future__ import annotations

import orjson
import pytest
import redis
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from history import derived as derived_tables
from history import schema
from history.client import HistoryClient, HistoryUnavailable
from history.ingester import GROUP, Ingester, IngesterCrash
from runtime.backends.redact import redact_url
from runtime.queue.keys import KeySpace
from runtime.telemetry import semconv
from runtime.telemetry.tracing import span_from_context
from tests.support.history_spans import drain

SECRET_URL = "https://alice:s3cr3t-pw@llm.example:8443/v1?api_key=k-123"

DISPATCH_ATTRS = {
    semconv.REQUEST_ID: "req-1",
    semconv.PRODUCER_ID: "prod-1",
    semconv.POOL_ID: "interactive",
    semconv.GROUP_ID: "g1",
    semconv.GATEWAY_ID: "gw-1",
    semconv.DISPATCHER_ID: "disp-1",
    semconv.BACKEND_URL: redact_url(SECRET_URL),
    semconv.GEN_AI_REQUEST_MODEL: "m-small",
    semconv.GEN_AI_RESPONSE_MODEL: "m-small-2025",
    semconv.MESSAGE_COUNT: 3,
    semconv.QUEUE_WAIT_S: 0.25,
    semconv.EXECUTION_S: 1.5,
    semconv.TOTAL_S: 1.75,
    semconv.STATUS: "error",
    semconv.ERROR_TYPE: "backend_error",
    semconv.ERROR_MESSAGE: f"502 from {SECRET_URL}",
    semconv.GEN_AI_USAGE_INPUT_TOKENS: 12,
    semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 34,
    semconv.COST_UNITS: 2,
    semconv.REPLY_DELIVERED: True,
    semconv.GEN_AI_OPERATION_NAME: "chat",
    semconv.SERVER_ADDRESS: "llm.example",
    semconv.SERVER_PORT: 8443,
}


def _emit_pair(provider: TracerProvider) -> tuple[str, str]:
    """A producer span and a dispatcher span linked through an envelope-style W3C carrier."""
    tracer = provider.get_tracer("llm_dispatch.test")
    submit = tracer.start_span(semconv.SPAN_NAME_SUBMIT, kind=trace.SpanKind.PRODUCER)
    submit.set_attribute(semconv.REQUEST_ID, "req-1")
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(submit))
    chat = tracer.start_span("chat m-small", context=span_from_context(carrier), kind=trace.SpanKind.CLIENT)
    chat.set_attributes(DISPATCH_ATTRS)
    chat.set_status(trace.Status(trace.StatusCode.ERROR, "backend_error"))
    chat.end()
    submit.end()
    provider.force_flush()
    return format(submit.get_span_context().trace_id, "032x"), format(
        submit.get_span_context().span_id, "016x"
    )


def _spans(history: HistoryClient) -> list[dict]:
    return history.query(
        f"SELECT *, {', '.join(c for c, _, _ in schema.TYPED_COLUMNS)} "
        f"FROM {schema.table_name(history)} ORDER BY Timestamp"
    )


def _count(history: HistoryClient, table: str) -> int:
    return int(history.query(f"SELECT count() AS n FROM {schema.table_name(history, table)}")[0]["n"])


def test_spans_arrive_with_every_attribute(provider: TracerProvider, ingester: Ingester, history) -> None:
    trace_id, submit_span_id = _emit_pair(provider)
    assert drain(ingester) == 2
    rows = {r["SpanKind"]: r for r in _spans(history)}
    chat, submit = rows["Client"], rows["Producer"]
    assert chat["TraceId"] == submit["TraceId"] == trace_id
    assert chat["ParentSpanId"] == submit_span_id == submit["SpanId"]
    assert chat["SpanName"] == "chat m-small" and chat["ServiceName"] == "llm-dispatch-dispatcher"
    assert chat["StatusCode"] == "Error" and chat["StatusMessage"] == "backend_error"
    assert chat["ScopeName"] == "llm_dispatch.test"
    assert chat["ResourceAttributes"]["service.name"] == "llm-dispatch-dispatcher"
    attrs = chat["SpanAttributes"]
    assert set(attrs) == set(DISPATCH_ATTRS)
    assert attrs[semconv.REPLY_DELIVERED] == "true" and attrs[semconv.SERVER_PORT] == "8443"
    assert attrs[semconv.QUEUE_WAIT_S] == "0.25"
    typed = {c: chat[c] for c, _, _ in schema.TYPED_COLUMNS}
    assert typed == {
        "RequestId": "req-1",
        "FabricGroup": "g1",
        "PoolId": "interactive",
        "ProducerId": "prod-1",
        "GatewayId": "gw-1",
        "DispatcherId": "disp-1",
        "Role": "",
        "Status": "error",
        "ErrorType": "backend_error",
        "DropReason": "",
        "RequestModel": "m-small",
        "ResponseModel": "m-small-2025",
        "QueueWaitS": 0.25,
        "ExecutionS": 1.5,
        "TotalS": 1.75,
        "InputTokens": 12,
        "OutputTokens": 34,
        # Not an ingress call and not streamed: no key label, no time to first token or chunk count.
        "ProducerLabel": "",
        "TimeToFirstTokenS": None,
        "ChunkCount": None,
        "Attempt": 1,  # no attempt attribute: a first attempt
    }
    assert chat["Duration"] > 0


def _all_text(history: HistoryClient) -> str:
    rows = history.query(f"SELECT formatRow('JSONEachRow', *) AS r FROM {schema.table_name(history)}")
    return "\n".join(r["r"] for r in rows)


def test_credentials_never_stored(
    provider: TracerProvider, ingester: Ingester, history: HistoryClient, sredis: redis.Redis, keys: KeySpace
) -> None:
    _emit_pair(provider)
    # A writer that bypasses the exporter's scrubbing: the ingester scrubs again.
    raw = {
        "trace_id": "ab" * 16,
        "span_id": "cd" * 8,
        "name": "chat raw",
        "start_ns": 1,
        "end_ns": 2,
        "status_message": f"failed {SECRET_URL}",
        "attributes": {"url": SECRET_URL, "urls": [SECRET_URL]},
        "resource": {"service.name": "other", "endpoint": SECRET_URL},
        "events": [{"ts_ns": 1, "name": "e", "attributes": {"u": SECRET_URL}}],
    }
    sredis.xadd(keys.span_stream(), {"span": orjson.dumps(raw)})
    assert drain(ingester) == 3
    text = _all_text(history)
    assert "llm.example" in text
    for secret in ("alice", "s3cr3t-pw", "k-123"):
        assert secret not in text
    assert all(secret not in str(row) for row in _spans(history) for secret in ("s3cr3t-pw", "k-123"))


def _crash_after_first_insert(
    provider: TracerProvider,
    sredis: redis.Redis,
    history: HistoryClient,
    keys: KeySpace,
    *,
    spans: int,
    read_ahead: bool = True,
) -> None:
    """Emits ``spans`` spans; an ingester inserts a batch of 20 and dies before acknowledging it."""
    tracer = provider.get_tracer("t")
    for i in range(spans):
        tracer.start_span(f"chat {i}", attributes={semconv.REQUEST_ID: f"r{i}"}).end()
    provider.force_flush()

    def crash(_: int) -> None:
        raise IngesterCrash

    first = Ingester(
        sredis, history, keys=keys, block_ms=50, batch_size=20, after_insert=crash, read_ahead=read_ahead
    )
    with pytest.raises(IngesterCrash):
        first.step()


def test_crash_between_insert_and_ack_loses_and_duplicates_nothing(
    provider: TracerProvider, sredis: redis.Redis, history: HistoryClient, keys: KeySpace
) -> None:
    _crash_after_first_insert(provider, sredis, history, keys, spans=30)
    # Mid-pipeline: the first (full) batch inserted, the next 10 read ahead while it was; none acked.
    assert sredis.xpending(keys.span_stream(), GROUP)["pending"] == 30
    restarted = Ingester(sredis, history, keys=keys, block_ms=50, batch_size=20)
    assert drain(restarted) == 30
    assert restarted.stats.redelivered == 30 and restarted.stats.batches == 2
    # The re-delivered batch was inserted twice and stored once, in the views' tables too.
    ids = sorted(r["RequestId"] for r in _spans(history))
    assert ids == sorted(f"r{i}" for i in range(30))
    assert _count(history, schema.REQUEST_IDS) == 30 and _count(history, schema.EXECUTIONS) == 0
    assert sredis.xpending(keys.span_stream(), GROUP)["pending"] == 0
    assert sredis.xlen(keys.span_stream()) == 0  # acknowledged entries are trimmed by the ingester


def test_without_read_ahead_one_batch_is_pending_at_a_time(
    provider: TracerProvider, sredis: redis.Redis, history: HistoryClient, keys: KeySpace
) -> None:
    _crash_after_first_insert(provider, sredis, history, keys, spans=30, read_ahead=False)
    assert sredis.xpending(keys.span_stream(), GROUP)["pending"] == 20


def test_clickhouse_down_keeps_spans_in_stream_until_it_returns(
    provider: TracerProvider, sredis: redis.Redis, history: HistoryClient, keys: KeySpace
) -> None:
    tracer = provider.get_tracer("t")
    for i in range(10):
        tracer.start_span(f"chat {i}").end()
    provider.force_flush()
    assert provider.span_exporter.exported == 10  # type: ignore[attr-defined]
    down = Ingester(sredis, HistoryClient("http://127.0.0.1:1"), keys=keys, block_ms=50)
    for _ in range(2):
        with pytest.raises(HistoryUnavailable):
            down.step()
    assert sredis.xlen(keys.span_stream()) == 10
    back = Ingester(sredis, history, keys=keys, block_ms=50)
    assert drain(back) == 10
    assert len(_spans(history)) == 10


def test_trim_counter_stays_zero_while_ingester_keeps_up(
    valkey_url: str, sredis: redis.Redis, history: HistoryClient, keys: KeySpace
) -> None:
    from runtime.telemetry.tracing import configure_tracing, shutdown_tracing

    tp = configure_tracing(
        redis_url=valkey_url,
        keys=keys,
        service_name="s",
        maxlen=150,
        install_global=False,
        schedule_delay_millis=5,
    )
    ing = Ingester(sredis, history, keys=keys, block_ms=20, batch_size=1000)
    tracer = tp.get_tracer("t")
    for _round in range(4):
        for _ in range(100):
            tracer.start_span("x").end()
        tp.force_flush()
        drain(ing)
    shutdown_tracing(tp, 2.0)
    assert int(sredis.get(keys.span_trim_counter()) or 0) == 0
    assert len(_spans(history)) == 400


def test_malformed_entries_are_acked_and_counted(
    ingester: Ingester, sredis: redis.Redis, keys: KeySpace, history: HistoryClient
) -> None:
    sredis.xadd(keys.span_stream(), {"span": b"not json"})
    sredis.xadd(keys.span_stream(), {"other": b"x"})
    assert drain(ingester) == 2
    assert ingester.stats.malformed == 2 and "malformed=2" in repr(ingester)
    assert _spans(history) == []


@pytest.mark.slow
def test_migrate_is_idempotent_and_applies_retention(history: HistoryClient) -> None:
    schema.migrate(history, retention_days=30)
    schema.migrate(history, retention_days=7)
    engine = history.query("SELECT engine_full FROM system.tables WHERE name = 'otel_traces'")[0][
        "engine_full"
    ]
    assert "toIntervalDay(7)" in engine and engine.startswith("MergeTree")
    assert f"non_replicated_deduplication_window = {schema.DEDUP_WINDOW}" in engine
    for derived in derived_tables.DERIVED:
        row = history.query(
            "SELECT engine_full FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            {"db": history.database, "t": derived.name},
        )[0]
        assert "toIntervalDay(7)" in row["engine_full"]


def test_a_batch_delivered_twice_is_stored_once_in_every_table(history: HistoryClient) -> None:
    from history.ingester import batch_token, span_row
    from tests.support.history_spans import execution_doc

    rows = [span_row(execution_doc(pool=f"p{i % 2}")) for i in range(10)]
    ids = [f"1700000000000-{i}".encode() for i in range(10)]
    for _ in range(2):
        history.insert(schema.TABLE, rows, schema.INSERT_COLUMNS, dedup_token=batch_token(ids))
    history.insert(schema.TABLE, rows[:3], schema.INSERT_COLUMNS, dedup_token=batch_token(ids[:3]))
    assert _count(history, schema.TABLE) == 13  # another batch (other ids) is stored
    assert _count(history, schema.EXECUTIONS) == 13 and _count(history, schema.REQUEST_IDS) == 13
    for table in (schema.POOL_MINUTES, schema.POOL_HOURS):  # the hours: a view over the minutes' inserts
        rows_of = history.query(f"SELECT sum(Executions) AS n FROM {schema.table_name(history, table)}")
        assert rows_of[0]["n"] == 13, table


@pytest.mark.slow
def test_redelivered_batch_with_entries_capped_meanwhile_is_stored_once(
    provider: TracerProvider, sredis: redis.Redis, history: HistoryClient, keys: KeySpace
) -> None:
    """The second delivery holds fewer rows than the first (the stream's cap deleted some): a block
    hash alone would not match; the token made from the batch's entry ids does."""
    _crash_after_first_insert(provider, sredis, history, keys, spans=20)
    entry_ids = [i for i, _ in sredis.xrange(keys.span_stream())]
    sredis.xdel(keys.span_stream(), *entry_ids[:5])  # what a MAXLEN trim does to the oldest entries
    restarted = Ingester(sredis, history, keys=keys, block_ms=50, batch_size=20)
    assert drain(restarted) == 20 and restarted.stats.redelivered == 15
    assert sorted(r["RequestId"] for r in _spans(history)) == sorted(f"r{i}" for i in range(20))
    assert _count(history, schema.EXECUTIONS) == 0 and _count(history, schema.REQUEST_IDS) == 20
    assert sredis.xpending(keys.span_stream(), GROUP)["pending"] == 0


def test_insert_types_are_the_tables_own(history: HistoryClient) -> None:
    """The ingester names each column's type (no DESCRIBE per insert): they must be the table's."""
    schema.migrate(history, retention_days=30)
    described = {r["name"]: r["type"] for r in history.query(f"DESCRIBE TABLE {schema.table_name(history)}")}
    assert [described[c] for c in schema.INSERT_COLUMNS] == schema.INSERT_TYPES


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ("plain", "plain"),
        (3, "3"),
        (0.25, "0.25"),
        (True, "true"),
        (False, "false"),
        (None, "null"),
        (["a", 2], '["a",2]'),
        (SECRET_URL, redact_url(SECRET_URL)),
        (f"502 from {SECRET_URL}", f"502 from {redact_url(SECRET_URL)}"),
        ([SECRET_URL], orjson.dumps([redact_url(SECRET_URL)]).decode()),
        ("x" * 600 + SECRET_URL, "x" * 600 + redact_url(SECRET_URL)),
    ],
)
def test_attribute_values_are_stored_as_strings_without_credentials(value: object, stored: str) -> None:
    from history.ingester import span_row
    from tests.support.history_spans import execution_doc

    doc = execution_doc()
    doc["attributes"]["v"] = value
    doc["events"] = [{"ts_ns": 1, "name": "e", "attributes": {"v": value}}]
    for _ in range(2):  # the second time from the decoder's cache of scrubbed URLs
        row = span_row(doc)
        attrs = row[schema.INSERT_COLUMNS.index("SpanAttributes")]
        events = row[schema.INSERT_COLUMNS.index("Events.Attributes")]
        assert attrs["v"] == stored and events == [{"v": stored}]


def test_while_keeping_up_an_insert_takes_what_arrived_since_the_last(
    sredis: redis.Redis, history: HistoryClient, keys: KeySpace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each insert writes a part per table: a caught-up ingester waits out its interval, so spans that
    arrive during the wait join the next insert instead of making one each."""
    from history import ingester as module
    from tests.support.history_spans import execution_doc

    def export(n: int) -> None:
        for _ in range(n):
            sredis.xadd(keys.span_stream(), {"span": orjson.dumps(execution_doc())})

    waits: list[float] = []

    def sleep(seconds: float) -> None:  # spans exported while the ingester waits
        waits.append(seconds)
        export(5)

    ingester = Ingester(sredis, history, keys=keys, block_ms=50, batch_size=100, min_insert_interval_s=30)
    export(5)
    assert ingester.step() == 5  # a batch smaller than batch_size: it has caught up
    monkeypatch.setattr(module.time, "sleep", sleep)
    export(5)
    assert ingester.step() == 10 and ingester.stats.batches == 2
    assert len(waits) == 1 and 0 < waits[0] <= 30
    assert _count(history, schema.TABLE) == 15
