"""The history table: the OpenTelemetry Collector ClickHouse exporter's ``otel_traces``, plus typed columns.

The first columns repeat the collector exporter's layout (database ``otel``, table ``otel_traces``) so a
collector pipeline can write the same table and the history views read its rows too. The typed columns
after them are ``MATERIALIZED`` from ``SpanAttributes``: computed once at insert, whoever inserts, and
read by the analytics instead of map lookups.

Duplicates: the ingester inserts a batch and then XACKs it; a crash between the two re-delivers the
batch and inserts it again. The engine is a ``ReplacingMergeTree`` whose sorting key ends in
``(TraceId, SpanId)``; a re-inserted span has the same sorting key (same service, name, timestamp and
ids), so merges collapse it, and every history query reads the table with ``FINAL`` so no duplicate is
ever counted even before a merge.

Typed columns added by a later version are added to an existing table by :func:`migrate` (older rows
compute them on read).

Retention: ``TTL toDateTime(Timestamp) + toIntervalDay(retention_days)``; :func:`migrate` re-applies it,
so changing ``HISTORY_RETENTION_DAYS`` takes effect on the next start. Creation is idempotent.
"""

from __future__ import annotations

from history.client import HistoryClient
from runtime.telemetry import semconv

TABLE = "otel_traces"


def _attr(name: str) -> str:
    return f"SpanAttributes['{name}']"


# (column, type, expression over SpanAttributes)
TYPED_COLUMNS: list[tuple[str, str, str]] = [
    ("RequestId", "String", _attr(semconv.REQUEST_ID)),
    ("FabricGroup", "LowCardinality(String)", _attr(semconv.GROUP_ID)),
    ("PoolId", "LowCardinality(String)", _attr(semconv.POOL_ID)),
    ("ProducerId", "String", _attr(semconv.PRODUCER_ID)),
    ("GatewayId", "LowCardinality(String)", _attr(semconv.GATEWAY_ID)),
    ("DispatcherId", "LowCardinality(String)", _attr(semconv.DISPATCHER_ID)),
    ("Role", "LowCardinality(String)", _attr(semconv.SPAN_KIND_ROLE)),
    ("Status", "LowCardinality(String)", _attr(semconv.STATUS)),
    ("ErrorType", "LowCardinality(String)", _attr(semconv.ERROR_TYPE)),
    ("DropReason", "LowCardinality(String)", _attr(semconv.DROP_REASON)),
    ("RequestModel", "LowCardinality(String)", _attr(semconv.GEN_AI_REQUEST_MODEL)),
    ("ResponseModel", "LowCardinality(String)", _attr(semconv.GEN_AI_RESPONSE_MODEL)),
    ("QueueWaitS", "Nullable(Float64)", f"toFloat64OrNull({_attr(semconv.QUEUE_WAIT_S)})"),
    ("ExecutionS", "Nullable(Float64)", f"toFloat64OrNull({_attr(semconv.EXECUTION_S)})"),
    ("TotalS", "Nullable(Float64)", f"toFloat64OrNull({_attr(semconv.TOTAL_S)})"),
    ("InputTokens", "Nullable(UInt64)", f"toUInt64OrNull({_attr(semconv.GEN_AI_USAGE_INPUT_TOKENS)})"),
    ("OutputTokens", "Nullable(UInt64)", f"toUInt64OrNull({_attr(semconv.GEN_AI_USAGE_OUTPUT_TOKENS)})"),
    # Which execution of the request a span is (1 = first); spans written before retries existed say 1.
    ("Attempt", "UInt32", f"greatest(1, toUInt32OrZero({_attr(semconv.ATTEMPT)}))"),
]

# Columns the ingester writes (the collector layout, Events and Links flattened as Nested arrays).
INSERT_COLUMNS = [
    "Timestamp",
    "TraceId",
    "SpanId",
    "ParentSpanId",
    "TraceState",
    "SpanName",
    "SpanKind",
    "ServiceName",
    "ResourceAttributes",
    "ScopeName",
    "ScopeVersion",
    "SpanAttributes",
    "Duration",
    "StatusCode",
    "StatusMessage",
    "Events.Timestamp",
    "Events.Name",
    "Events.Attributes",
    "Links.TraceId",
    "Links.SpanId",
    "Links.TraceState",
    "Links.Attributes",
]


def table_name(client: HistoryClient) -> str:
    return f"`{client.database}`.`{TABLE}`"


def create_table_sql(database: str, retention_days: int) -> str:
    typed = ",\n".join(
        f"    `{name}` {ctype} MATERIALIZED {expr} CODEC(ZSTD(1))" for name, ctype, expr in TYPED_COLUMNS
    )
    return f"""
CREATE TABLE IF NOT EXISTS `{database}`.`{TABLE}` (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration UInt64 CODEC(ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
        Timestamp DateTime64(9),
        Name LowCardinality(String),
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    Links Nested (
        TraceId String,
        SpanId String,
        TraceState String,
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
{typed},
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_request_id RequestId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), TraceId, SpanId)
TTL toDateTime(Timestamp) + toIntervalDay({int(retention_days)})
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1
"""


def migrate(client: HistoryClient, *, retention_days: int) -> None:
    """Creates the database and table if missing and (re)applies the retention TTL. Idempotent.

    Raises ``HistoryUnavailable`` when ClickHouse cannot be reached.
    """
    if retention_days < 1:
        raise ValueError("retention_days must be at least 1")
    client.command(f"CREATE DATABASE IF NOT EXISTS `{client.database}`")
    client.command(create_table_sql(client.database, retention_days))
    # A table created by an earlier version lacks the typed columns added since.
    for name, ctype, expr in TYPED_COLUMNS:
        client.command(
            f"ALTER TABLE {table_name(client)} ADD COLUMN IF NOT EXISTS `{name}` {ctype} "
            f"MATERIALIZED {expr} CODEC(ZSTD(1))"
        )
    rows = client.query(
        "SELECT engine_full FROM system.tables WHERE database = {db:String} AND name = {table:String}",
        {"db": client.database, "table": TABLE},
    )
    wanted = f"toIntervalDay({int(retention_days)})"
    if rows and wanted not in str(rows[0]["engine_full"]):
        client.command(
            f"ALTER TABLE {table_name(client)} MODIFY TTL toDateTime(Timestamp) + {wanted} "
            "SETTINGS materialize_ttl_after_modify = 0"
        )
