"""The narrow tables that materialized views fill from ``otel_traces``, one per read path.

See :mod:`history.schema` for what each is for, deduplication and retention.

Each :class:`DerivedTable` is a table, the view that fills it on every insert, and the SELECT that also
fills it once from the rows already stored when :func:`history.schema.migrate` first creates it.
"""

from __future__ import annotations

from dataclasses import dataclass

from history.schema import (
    DD_QUANTILES,
    EXECUTION_COLUMNS,
    EXECUTIONS,
    FILTER_COLUMNS,
    FILTER_VALUES,
    POOL_HOURS,
    POOL_MINUTES,
    REQUEST_IDS,
    TABLE,
    dedup_settings,
    ttl_clause,
)


@dataclass(frozen=True, slots=True)
class DerivedTable:
    """A table filled by a materialized view over ``otel_traces`` (and once from its rows on creation)."""

    name: str
    columns: str  # the column list of CREATE TABLE
    engine: str  # ENGINE ... SETTINGS, with {ttl} where the retention TTL goes
    select: str  # the view's SELECT over {source}; also fills the table from existing rows
    ttl_expr: str
    source: str = TABLE  # the table whose inserts the view receives

    @property
    def view(self) -> str:
        return f"{self.name}_mv"

    def create_sql(self, database: str, retention_days: int) -> str:
        engine = self.engine.format(ttl=ttl_clause(self.ttl_expr, retention_days), dedup=dedup_settings())
        return f"CREATE TABLE IF NOT EXISTS `{database}`.`{self.name}` ({self.columns}) {engine}"

    def select_sql(self, database: str) -> str:
        return self.select.format(source=f"`{database}`.`{self.source}`")

    def view_sql(self, database: str) -> str:
        return (
            f"CREATE MATERIALIZED VIEW IF NOT EXISTS `{database}`.`{self.view}` "
            f"TO `{database}`.`{self.name}` AS {self.select_sql(database)}"
        )


_POOL_SUMS = (
    "Executions",
    "Ok",
    "Errors",
    "Dropped",
    "InputTokenSum",
    "OutputTokenSum",
    "RateOutputTokens",
    "RateSeconds",
)
_POOL_SKETCHES = ("QueueWait", "Execution", "Total")
_DD_MERGE_STATE = DD_QUANTILES.replace("quantilesDD", "quantilesDDMergeState")


def _pool_columns(period: str) -> str:
    sums = ", ".join(
        f"{c} SimpleAggregateFunction(sum, {'Float64' if c == 'RateSeconds' else 'UInt64'})"
        for c in _POOL_SUMS
    )
    sketches = ", ".join(f"{c} AggregateFunction({DD_QUANTILES}, Float64)" for c in _POOL_SKETCHES)
    return (
        f"{period} DateTime CODEC(Delta, ZSTD(1)), FabricGroup LowCardinality(String), "
        f"PoolId LowCardinality(String), {sums}, {sketches}"
    )


def _pool_engine(period: str) -> str:
    return (
        f"ENGINE = AggregatingMergeTree PARTITION BY toDate({period}) "
        f"ORDER BY (FabricGroup, PoolId, {period}) {{ttl}} "
        # Small granules: a short window reads its few rows' sketches, not the day's.
        "SETTINGS index_granularity = 256, ttl_only_drop_parts = 1, {dedup}"
    )


_EXECUTED = "Status IN ('ok', 'error')"
_TOKEN_RATE = "Status = 'ok' AND ExecutionS > 0 AND OutputTokens IS NOT NULL"


def _dd_state(column: str) -> str:
    state = DD_QUANTILES.replace("quantilesDD", "quantilesDDStateIf")
    return f"{state}(assumeNotNull({column}), {_EXECUTED} AND {column} IS NOT NULL)"


_filter_pairs = ", ".join(f"('{name}', toString({col}))" for name, col in FILTER_COLUMNS.items())

DERIVED: tuple[DerivedTable, ...] = (
    DerivedTable(
        name=EXECUTIONS,
        columns="Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)), "
        "RequestId String CODEC(ZSTD(1)), TraceId String CODEC(ZSTD(1)), SpanId String CODEC(ZSTD(1)), "
        "FabricGroup LowCardinality(String), PoolId LowCardinality(String), "
        "ProducerId LowCardinality(String), GatewayId LowCardinality(String), "
        "DispatcherId LowCardinality(String), Status LowCardinality(String), "
        "ErrorType LowCardinality(String), DropReason LowCardinality(String), "
        "RequestModel LowCardinality(String), ResponseModel LowCardinality(String), "
        "QueueWaitS Nullable(Float64) CODEC(ZSTD(1)), ExecutionS Nullable(Float64) CODEC(ZSTD(1)), "
        "TotalS Nullable(Float64) CODEC(ZSTD(1)), InputTokens Nullable(UInt64) CODEC(T64, ZSTD(1)), "
        "OutputTokens Nullable(UInt64) CODEC(T64, ZSTD(1)), ProducerLabel LowCardinality(String), "
        "TimeToFirstTokenS Nullable(Float64) CODEC(ZSTD(1)), "
        "ChunkCount Nullable(UInt64) CODEC(T64, ZSTD(1)), "
        # Filters on rare values skip granules instead of reading the whole window.
        "INDEX idx_group FabricGroup TYPE set(64) GRANULARITY 1, "
        "INDEX idx_pool PoolId TYPE set(256) GRANULARITY 1, "
        "INDEX idx_producer ProducerId TYPE bloom_filter(0.01) GRANULARITY 1, "
        "INDEX idx_gateway GatewayId TYPE set(64) GRANULARITY 1, "
        "INDEX idx_status Status TYPE set(8) GRANULARITY 1, "
        "INDEX idx_error_type ErrorType TYPE set(64) GRANULARITY 1, "
        "INDEX idx_model RequestModel TYPE set(64) GRANULARITY 1",
        engine="ENGINE = MergeTree PARTITION BY toDate(Timestamp) ORDER BY (Timestamp, SpanId) {ttl} "
        "SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, {dedup}",
        select=f"SELECT Timestamp, {', '.join(EXECUTION_COLUMNS)} FROM {{source}} WHERE Status != ''",
        ttl_expr="toDateTime(Timestamp)",
    ),
    DerivedTable(
        name=REQUEST_IDS,
        columns="RequestId String CODEC(ZSTD(1)), TraceId String CODEC(ZSTD(1)), "
        "Start DateTime64(9) CODEC(Delta, ZSTD(1)), End DateTime64(9) CODEC(Delta, ZSTD(1))",
        engine="ENGINE = MergeTree PARTITION BY toDate(Start) ORDER BY (RequestId, TraceId) {ttl} "
        "SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, {dedup}",
        select="SELECT RequestId, TraceId, min(Timestamp) AS Start, max(Timestamp) AS End "
        "FROM {source} WHERE RequestId != '' GROUP BY RequestId, TraceId",
        ttl_expr="toDateTime(Start)",
    ),
    DerivedTable(
        name=POOL_MINUTES,
        columns=_pool_columns("Minute"),
        engine=_pool_engine("Minute"),
        select="SELECT toStartOfMinute(Timestamp) AS Minute, FabricGroup, PoolId, "
        "count() AS Executions, countIf(Status = 'ok') AS Ok, countIf(Status = 'error') AS Errors, "
        "countIf(Status = 'dropped') AS Dropped, "
        "sum(ifNull(InputTokens, 0)) AS InputTokenSum, sum(ifNull(OutputTokens, 0)) AS OutputTokenSum, "
        f"sumIf(assumeNotNull(OutputTokens), {_TOKEN_RATE}) AS RateOutputTokens, "
        f"sumIf(assumeNotNull(ExecutionS), {_TOKEN_RATE}) AS RateSeconds, "
        f"{_dd_state('QueueWaitS')} AS QueueWait, {_dd_state('ExecutionS')} AS Execution, "
        f"{_dd_state('TotalS')} AS Total "
        "FROM {source} WHERE Status != '' GROUP BY Minute, FabricGroup, PoolId",
        ttl_expr="Minute",
    ),
    DerivedTable(
        # Rolled up from the minutes as they are inserted: long windows merge 60x fewer sketches.
        name=POOL_HOURS,
        columns=_pool_columns("Hour"),
        engine=_pool_engine("Hour"),
        select="SELECT toStartOfHour(m.Minute) AS Hour, m.FabricGroup AS FabricGroup, m.PoolId AS PoolId, "
        + ", ".join(f"sum(m.{c}) AS {c}" for c in _POOL_SUMS)
        + ", "
        + ", ".join(f"{_DD_MERGE_STATE}(m.{c}) AS {c}" for c in _POOL_SKETCHES)
        + " FROM {source} AS m GROUP BY Hour, FabricGroup, PoolId",
        ttl_expr="Hour",
        source=POOL_MINUTES,
    ),
    DerivedTable(
        name=FILTER_VALUES,
        columns="Name LowCardinality(String), Value String, LastSeen SimpleAggregateFunction(max, DateTime)",
        engine="ENGINE = AggregatingMergeTree ORDER BY (Name, Value) {ttl} SETTINGS {dedup}",
        select="SELECT pair.1 AS Name, pair.2 AS Value, max(toDateTime(Timestamp)) AS LastSeen "
        f"FROM {{source}} ARRAY JOIN [{_filter_pairs}] AS pair "
        "WHERE Status != '' AND Value != '' GROUP BY Name, Value",
        ttl_expr="LastSeen",
    ),
)
