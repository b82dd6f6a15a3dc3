"""Per-tenant figures of a pool's history (issue 22): who used a pool, how much, and how long they waited.

The tenant is a span attribute (``llm_dispatch.tenant``) that no aggregate keeps, so this reads the final
spans of the window from ``otel_traces`` directly, bounded per pool.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from history.client import HistoryClient
from history.queries import ExecutionFilter, where_clause
from history.schema import table_name
from runtime.telemetry import semconv

TENANT_LIMIT = 50


def tenant_usage(
    *,
    client: HistoryClient,
    since: datetime,
    until: datetime,
    pool: str = "",
    group: str = "",
    limit: int = TENANT_LIMIT,
) -> list[dict[str, Any]]:
    """Per pool and tenant: requests, input and output tokens, exact queue wait p50/p99 (``p50``, ``p99``).

    Reads the dispatcher spans tagged with a tenant straight from ``otel_traces`` (no aggregate keeps the
    tenant). A request is a final span (ok, error or dropped); waits cover executed requests as the pool
    figures do. Each pool keeps its ``limit`` tenants with the most requests, busiest first.
    """
    where, params = where_clause(ExecutionFilter(group=group, pool=pool, since=since, until=until))
    tenant = f"SpanAttributes['{semconv.TENANT}']"
    rows = client.query(
        f"""
        SELECT PoolId AS pool, {tenant} AS tenant, count() AS requests,
            sum(ifNull(InputTokens, 0)) AS input_tokens, sum(ifNull(OutputTokens, 0)) AS output_tokens,
            quantilesExactInclusiveIf(0.5, 0.99)(QueueWaitS, Status IN ('ok', 'error')) AS wait
        FROM {table_name(client)}
        WHERE {where} AND Status IN ('ok', 'error', 'dropped') AND {tenant} != ''
        GROUP BY pool, tenant ORDER BY pool, requests DESC, tenant LIMIT {max(1, int(limit))} BY pool
        """,
        params,
    )
    for r in rows:
        waits = [None if math.isnan(w) else float(w) for w in r.pop("wait")] or [None, None]
        r["p50"], r["p99"] = waits
    return rows
