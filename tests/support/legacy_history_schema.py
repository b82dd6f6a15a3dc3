"""The history table as versions before issue 14 created it: ReplacingMergeTree read with FINAL, no
insert deduplication, ProducerId a plain String, Duration without T64."""

from __future__ import annotations

from history import schema

_CHANGES = [
    ("ENGINE = MergeTree", "ENGINE = ReplacingMergeTree"),
    (f", non_replicated_deduplication_window = {schema.DEDUP_WINDOW}", ""),
    ("`ProducerId` LowCardinality(String)", "`ProducerId` String"),
    ("Duration UInt64 CODEC(T64, ZSTD(1))", "Duration UInt64 CODEC(ZSTD(1))"),
]


def legacy_create_table_sql(database: str, retention_days: int) -> str:
    sql = schema.create_table_sql(database, retention_days)
    for current, old in _CHANGES:
        assert current in sql, current
        sql = sql.replace(current, old)
    return sql
