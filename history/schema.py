"""The history schema: the OpenTelemetry Collector's ``otel_traces`` plus narrow tables fed by views.

``otel_traces`` repeats the collector ClickHouse exporter's layout (database ``otel``) so a collector
pipeline can write the same table; the typed columns after the collector's are ``MATERIALIZED`` from
``SpanAttributes`` at insert, whoever inserts. Materialized views fan every insert out into tables laid
out for one page each, so no page reads the wide table except by a pruned key:

``llm_dispatch_executions``     executions only, narrow, sorted by time: the recent list, its paging
                                and the exact analytics mode read it in order.
``llm_dispatch_request_ids``    request id -> trace id and time range, sorted by request id: the
                                detail page finds a request in one granule per day partition.
``llm_dispatch_pool_minutes``   per group, pool and minute: counts, token sums and DDSketch quantile
                                states; analytics cost grows with minutes x pools, not with traffic.
``llm_dispatch_pool_hours``     the same per hour, rolled up from the minutes: long windows.
``llm_dispatch_filter_values``  each filter value with the last time it was seen: the drop-downs.

Duplicates: the ingester inserts a batch and then XACKs it; a crash between the two re-delivers the
batch. Each batch carries an ``insert_deduplication_token`` derived from its stream entry ids, and every
table keeps the last ``DEDUP_WINDOW`` block hashes (``non_replicated_deduplication_window``), so the
second insert is dropped, views included (``deduplicate_blocks_in_dependent_materialized_views``).
Reads never need ``FINAL``.

Retention: daily partitions and ``TTL ... + toIntervalDay(retention_days)`` with ``ttl_only_drop_parts``
drop whole days; :func:`migrate` re-applies the TTL, so ``HISTORY_RETENTION_DAYS`` takes effect on the
next start. :func:`migrate` is idempotent and brings a database created by an older version forward:
it adds the dedup setting, creates the narrow tables and their views, and fills each new table once
from the rows already stored. Rows inserted by another writer *during* that first fill may be counted
twice in the new tables; run ``manage.py history_migrate`` before starting writers.
"""

from __future__ import annotations

from history.client import HistoryClient
from runtime.telemetry import semconv

TABLE = "otel_traces"
EXECUTIONS = "llm_dispatch_executions"
REQUEST_IDS = "llm_dispatch_request_ids"
POOL_MINUTES = "llm_dispatch_pool_minutes"
POOL_HOURS = "llm_dispatch_pool_hours"
FILTER_VALUES = "llm_dispatch_filter_values"

DEDUP_WINDOW = 10_000  # blocks remembered per table: minutes of batches at full rate, per partition
QUANTILE_LEVELS = (0.5, 0.95, 0.99)
# DDSketch's accuracy parameter. ClickHouse's sketch reads high by up to about 2.8x this (bucket bound
# plus rank rounding; measured on lognormal latencies), so the pages state STATED_ACCURACY.
SKETCH_ACCURACY = 0.005
STATED_ACCURACY = 0.02  # an approximate percentile is within 2 % of the exact value at that rank
DD_QUANTILES = f"quantilesDD({SKETCH_ACCURACY}, {', '.join(str(q) for q in QUANTILE_LEVELS)})"


def _attr(name: str) -> str:
    return f"SpanAttributes['{name}']"


# (column, type, expression over SpanAttributes)
TYPED_COLUMNS: list[tuple[str, str, str]] = [
    ("RequestId", "String", _attr(semconv.REQUEST_ID)),
    ("FabricGroup", "LowCardinality(String)", _attr(semconv.GROUP_ID)),
    ("PoolId", "LowCardinality(String)", _attr(semconv.POOL_ID)),
    ("ProducerId", "LowCardinality(String)", _attr(semconv.PRODUCER_ID)),
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
    # An ingress request's key name: the producer an operator recognises (its id is per web process).
    ("ProducerLabel", "LowCardinality(String)", _attr(semconv.PRODUCER_LABEL)),
    ("TimeToFirstTokenS", "Nullable(Float64)", f"toFloat64OrNull({_attr(semconv.TIME_TO_FIRST_TOKEN_S)})"),
    ("ChunkCount", "Nullable(UInt64)", f"toUInt64OrNull({_attr(semconv.CHUNK_COUNT)})"),
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

_LC = "LowCardinality(String)"
_ATTRS = "Map(LowCardinality(String), String)"
# Their types as in CREATE TABLE below: an insert that names them needs no DESCRIBE round trip first.
INSERT_TYPES = [
    "DateTime64(9)",
    "String",
    "String",
    "String",
    "String",
    _LC,
    _LC,
    _LC,
    _ATTRS,
    "String",
    "String",
    _ATTRS,
    "UInt64",
    _LC,
    "String",
    "Array(DateTime64(9))",
    f"Array({_LC})",
    f"Array({_ATTRS})",
    "Array(String)",
    "Array(String)",
    "Array(String)",
    f"Array({_ATTRS})",
]

# The execution columns the narrow table copies (names and types as in otel_traces).
EXECUTION_COLUMNS = [
    "RequestId",
    "TraceId",
    "SpanId",
    "FabricGroup",
    "PoolId",
    "ProducerId",
    "GatewayId",
    "DispatcherId",
    "Status",
    "ErrorType",
    "DropReason",
    "RequestModel",
    "ResponseModel",
    "QueueWaitS",
    "ExecutionS",
    "TotalS",
    "InputTokens",
    "OutputTokens",
    "ProducerLabel",
    "TimeToFirstTokenS",
    "ChunkCount",
]

# Filter form field -> column, for the drop-downs' values.
FILTER_COLUMNS = {
    "group": "FabricGroup",
    "pool": "PoolId",
    # A producer is its label (an ingress request's key name) where it has one, else its id.
    "producer": "if(ProducerLabel != '', ProducerLabel, ProducerId)",
    "gateway": "GatewayId",
    "status": "Status",
    "error_type": "ErrorType",
    "model": "RequestModel",
}


def table_name(client: HistoryClient, table: str = TABLE) -> str:
    return f"`{client.database}`.`{table}`"


def ttl_clause(expr: str, retention_days: int) -> str:
    return f"TTL {expr} + toIntervalDay({int(retention_days)})"


def dedup_settings() -> str:
    return f"non_replicated_deduplication_window = {DEDUP_WINDOW}"


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
    Duration UInt64 CODEC(T64, ZSTD(1)),
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
) ENGINE = MergeTree
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), TraceId, SpanId)
{ttl_clause("toDateTime(Timestamp)", retention_days)}
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, {dedup_settings()}
"""


def _engines(client: HistoryClient) -> dict[str, str]:
    """Every table and view of the history database: name -> ``engine_full`` (one query)."""
    rows = client.query(
        "SELECT name, engine_full FROM system.tables WHERE database = {db:String}", {"db": client.database}
    )
    return {str(row["name"]): str(row["engine_full"]) for row in rows}


def _columns(client: HistoryClient, table: str) -> set[str]:
    rows = client.query(
        "SELECT name FROM system.columns WHERE database = {db:String} AND table = {table:String}",
        {"db": client.database, "table": table},
    )
    return {str(row["name"]) for row in rows}


def _apply_ttl(client: HistoryClient, table: str, engine: str, expr: str, retention_days: int) -> None:
    wanted = f"toIntervalDay({int(retention_days)})"
    if wanted not in engine:
        client.command(
            f"ALTER TABLE {table_name(client, table)} MODIFY TTL {expr} + {wanted} "
            "SETTINGS materialize_ttl_after_modify = 0"
        )


def migrate(client: HistoryClient, *, retention_days: int) -> None:
    """Creates or brings forward the history tables and views, and (re)applies the TTL. Idempotent.

    Raises ``HistoryUnavailable`` when ClickHouse cannot be reached.

    Only what is missing or different is written: each DDL statement costs chDB 0.1-0.5 s of wall time
    even when ``IF NOT EXISTS`` makes it change nothing (39 statements made every process start and
    every test's fresh database wait 4 s at load 10), so an up-to-date database costs three reads.
    """
    from history.derived import DERIVED  # defined over this module's names: imported when used

    if retention_days < 1:
        raise ValueError("retention_days must be at least 1")
    db = client.database
    client.command(f"CREATE DATABASE IF NOT EXISTS `{db}`")
    engines = _engines(client)
    if TABLE not in engines:
        client.command(create_table_sql(db, retention_days))  # empty: nothing to copy into the others
    else:
        _bring_forward(client, engines[TABLE], retention_days)
    fresh_tables = [d for d in DERIVED if d.name not in engines]
    if TABLE in engines and fresh_tables and engines[TABLE].startswith("ReplacingMergeTree"):
        # Brought forward from a version that read with FINAL: collapse its stored duplicates once,
        # before they are copied into the new tables (a full merge: minutes on a very large table).
        client.command(f"OPTIMIZE TABLE {table_name(client)} FINAL")
    for derived in DERIVED:
        fresh = derived in fresh_tables
        if fresh:
            client.command(derived.create_sql(db, retention_days))
        else:
            _apply_ttl(client, derived.name, engines[derived.name], derived.ttl_expr, retention_days)
        if derived.view not in engines:
            client.command(derived.view_sql(db))
        if fresh and TABLE in engines:  # the rows stored before the table existed
            client.command(f"INSERT INTO {table_name(client, derived.name)} {derived.select_sql(db)}")


def _bring_forward(client: HistoryClient, engine: str, retention_days: int) -> None:
    """The main table as an older version made it: insert deduplication, the typed columns, the TTL."""
    if dedup_settings() not in engine:  # the engine itself cannot change
        client.command(f"ALTER TABLE {table_name(client)} MODIFY SETTING {dedup_settings()}")
    present = _columns(client, TABLE)
    for name, ctype, expr in TYPED_COLUMNS:  # columns added since the table was made
        if name not in present:
            client.command(
                f"ALTER TABLE {table_name(client)} ADD COLUMN IF NOT EXISTS `{name}` {ctype} "
                f"MATERIALIZED {expr} CODEC(ZSTD(1))"
            )
    _apply_ttl(client, TABLE, engine, "toDateTime(Timestamp)", retention_days)
