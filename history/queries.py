"""Selectors over the history table. Every read uses ``FINAL`` (see ``history.schema`` on duplicates).

An *execution* is a dispatcher span: a row whose ``llm_dispatch.status`` attribute is set (ok, error or
dropped). Producer spans share its trace and appear in the request's detail.

Percentiles are exact, ClickHouse's ``quantilesExactInclusive``: for the sorted values x[0..n-1] and level
p, with h = (n - 1) * p, the result is x[floor h] + (h - floor h) * (x[floor h + 1] - x[floor h]) (linear
interpolation between closest ranks, numpy's default "linear" method). Latency percentiles cover executed
requests (status ok or error: a request's final attempt), not drops. Error rate is errors / (ok + errors).
An attempt that failed and was scheduled again has status ``retry``; a durable request put back after its
dispatcher's lease expired has status ``requeued``. Retry rate is retry / (ok + errors + retry): the share of
backend attempts that failed transiently and ran again. Tokens per second is
output tokens divided by execution seconds, summed over successful executions that reported tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from history.client import HistoryClient
from history.schema import table_name
from runtime.telemetry import semconv

LEVELS = (0.5, 0.95, 0.99)
STATUSES = ("ok", "error", "dropped", "retry", "requeued")
DEAD_LETTERED = "dead_lettered"

_PRODUCER_LABEL = f"SpanAttributes['{semconv.PRODUCER_LABEL}']"
_FILTER_COLUMNS = {
    "group": "FabricGroup",
    "pool": "PoolId",
    # A producer is its id, or its label (an ingress request's key name).
    "producer": f"if({_PRODUCER_LABEL} != '', {_PRODUCER_LABEL}, ProducerId)",
    "gateway": "GatewayId",
    "status": "Status",
    "error_type": "ErrorType",
}

_ROW_COLUMNS = f"""
    toUnixTimestamp64Nano(Timestamp) AS ts_ns, RequestId AS request_id, TraceId AS trace_id,
    SpanId AS span_id,
    FabricGroup AS group, PoolId AS pool, ProducerId AS producer, GatewayId AS gateway,
    DispatcherId AS dispatcher, Status AS status, ErrorType AS error_type, DropReason AS drop_reason,
    RequestModel AS model, ResponseModel AS response_model, QueueWaitS AS queue_wait_s,
    ExecutionS AS execution_s, TotalS AS total_s, InputTokens AS input_tokens, OutputTokens AS output_tokens,
    SpanAttributes['{semconv.PRODUCER_LABEL}'] AS producer_label,
    toFloat64OrNull(SpanAttributes['{semconv.TIME_TO_FIRST_TOKEN_S}']) AS time_to_first_token_s,
    toUInt64OrNull(SpanAttributes['{semconv.CHUNK_COUNT}']) AS chunk_count, Attempt AS attempt
"""


@dataclass(frozen=True, slots=True)
class ExecutionFilter:
    """Filters for the recent list; empty strings and None mean "any"."""

    group: str = ""
    pool: str = ""
    producer: str = ""
    gateway: str = ""
    status: str = ""
    error_type: str = ""
    model: str = ""
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[dict[str, Any]]
    page: int
    page_size: int
    has_next: bool

    @property
    def has_previous(self) -> bool:
        return self.page > 1


@dataclass(slots=True)
class PoolStats:
    pool: str
    group: str
    count: int
    ok: int
    errors: int
    dropped: int
    error_rate: float | None
    queue_wait: dict[float, float | None] = field(default_factory=dict)
    execution: dict[float, float | None] = field(default_factory=dict)
    total: dict[float, float | None] = field(default_factory=dict)
    tokens_per_s: float | None = None
    timeline: list[int] = field(default_factory=list)
    retries: int = 0
    requeues: int = 0
    dead_letters: int = 0
    retry_rate: float | None = None


def _ns(moment: datetime) -> int:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1_000_000) * 1000


def _row(raw: dict[str, Any]) -> dict[str, Any]:
    raw["timestamp"] = datetime.fromtimestamp(raw.pop("ts_ns") / 1e9, tz=UTC)
    return raw


def _where(filters: ExecutionFilter) -> tuple[str, dict[str, Any]]:
    clauses, params = ["Status != ''"], {}
    for name, column in _FILTER_COLUMNS.items():
        value = getattr(filters, name)
        if value:
            clauses.append(f"{column} = {{{name}:String}}")
            params[name] = value
    if filters.model:
        clauses.append("(RequestModel = {model:String} OR ResponseModel = {model:String})")
        params["model"] = filters.model
    if filters.since is not None:
        clauses.append("Timestamp >= fromUnixTimestamp64Nano({since:Int64})")
        params["since"] = _ns(filters.since)
    if filters.until is not None:
        clauses.append("Timestamp < fromUnixTimestamp64Nano({until:Int64})")
        params["until"] = _ns(filters.until)
    return " AND ".join(clauses), params


def executions_recent(
    *, client: HistoryClient, filters: ExecutionFilter = ExecutionFilter(), page: int = 1, page_size: int = 50
) -> Page:
    """Newest executions first, filtered and paged."""
    page, page_size = max(1, page), max(1, min(page_size, 500))
    where, params = _where(filters)
    rows = client.query(
        f"SELECT {_ROW_COLUMNS} FROM {table_name(client)} FINAL WHERE {where} "
        f"ORDER BY Timestamp DESC, SpanId LIMIT {page_size + 1} OFFSET {(page - 1) * page_size}",
        params,
    )
    return Page([_row(r) for r in rows[:page_size]], page, page_size, len(rows) > page_size)


def filter_choices(*, client: HistoryClient, since: datetime | None = None) -> dict[str, list[str]]:
    """Distinct values for the filter form's drop-downs (bounded)."""
    where = "Status != ''"
    params: dict[str, Any] = {}
    if since is not None:
        where += " AND Timestamp >= fromUnixTimestamp64Nano({since:Int64})"
        params["since"] = _ns(since)
    columns = {**_FILTER_COLUMNS, "model": "RequestModel"}
    selects = ", ".join(f"arraySort(groupUniqArray(200)({col})) AS {name}" for name, col in columns.items())
    rows = client.query(f"SELECT {selects} FROM {table_name(client)} WHERE {where}", params)
    if not rows:
        return {name: [] for name in columns}
    return {name: [v for v in rows[0][name] if v] for name in columns}


def execution_detail(*, client: HistoryClient, request_id: str) -> dict[str, Any] | None:
    """One request: its dispatcher span(s) (attempts, newest last) and every span of its trace."""
    spans = client.query(
        f"SELECT {_ROW_COLUMNS}, SpanName AS name, SpanKind AS kind, ServiceName AS service, "
        "ParentSpanId AS parent_span_id, Duration AS duration_ns, StatusCode AS status_code, "
        "StatusMessage AS status_message, SpanAttributes AS attributes, ResourceAttributes AS resource "
        f"FROM {table_name(client)} FINAL WHERE RequestId = {{rid:String}} ORDER BY Timestamp",
        {"rid": request_id},
    )
    if not spans:
        return None
    spans = [_row(s) for s in spans]
    executions = attempt_chain([s for s in spans if s["status"]])
    main = executions[-1] if executions else spans[-1]
    trace_spans = client.query(
        "SELECT toUnixTimestamp64Nano(Timestamp) AS ts_ns, SpanId AS span_id, "
        "ParentSpanId AS parent_span_id, "
        "SpanName AS name, SpanKind AS kind, ServiceName AS service, Duration AS duration_ns, "
        "StatusCode AS status_code, StatusMessage AS status_message, SpanAttributes AS attributes "
        f"FROM {table_name(client)} FINAL WHERE TraceId = {{tid:String}} ORDER BY Timestamp",
        {"tid": main["trace_id"]},
    )
    return {"execution": main, "attempts": executions, "trace": [_row(s) for s in trace_spans]}


def attempt_chain(executions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A request's dispatcher spans in the order they ran, each with ``wait_s``: how long it waited
    before it started (in its queue for the first, since the previous attempt ended for a later one).

    Every attempt's span starts at the request's enqueue time, so its own start is enqueue + queue wait.
    """

    def started(span: dict[str, Any]) -> float:
        return float(span["timestamp"].timestamp()) + float(span["queue_wait_s"] or 0.0)

    chain = sorted(executions, key=lambda span: (span["attempt"], started(span)))
    previous_end: float | None = None
    for span in chain:
        begin = started(span)
        span["wait_s"] = span["queue_wait_s"] if previous_end is None else max(0.0, begin - previous_end)
        span["error_message"] = dict(span.get("attributes") or {}).get(semconv.ERROR_MESSAGE, "")
        previous_end = begin + float(span["execution_s"] or 0.0)
    return chain


def _quantiles(values: list[float] | None) -> dict[float, float | None]:
    values = values or []
    return {
        level: (None if i >= len(values) or math.isnan(values[i]) else float(values[i]))
        for i, level in enumerate(LEVELS)
    }


def pool_analytics(
    *, client: HistoryClient, since: datetime, until: datetime, group: str = "", buckets: int = 24
) -> list[PoolStats]:
    """Per-pool counts, error rate, exact p50/p95/p99 of queue wait, execution and total, tokens/s."""
    where, params = _where(ExecutionFilter(group=group, since=since, until=until))
    levels = ", ".join(str(level) for level in LEVELS)
    executed = "Status IN ('ok', 'error')"
    span_ns = max(1, _ns(until) - _ns(since))
    params.update({"bucket_ns": math.ceil(span_ns / buckets), "start_ns": _ns(since)})
    rows = client.query(
        f"""
        SELECT PoolId AS pool, any(FabricGroup) AS group, count() AS count,
            countIf(Status = 'ok') AS ok, countIf(Status = 'error') AS errors,
            countIf(Status = 'dropped') AS dropped, countIf(Status = 'retry') AS retries,
            countIf(Status = 'requeued') AS requeues, countIf(ErrorType = '{DEAD_LETTERED}') AS dead_letters,
            quantilesExactInclusiveIf({levels})(QueueWaitS, {executed}) AS queue_wait,
            quantilesExactInclusiveIf({levels})(ExecutionS, {executed}) AS execution,
            quantilesExactInclusiveIf({levels})(TotalS, {executed}) AS total,
            sumIf(OutputTokens, Status = 'ok' AND ExecutionS > 0) AS out_tokens,
            sumIf(ExecutionS, Status = 'ok' AND ExecutionS > 0 AND OutputTokens IS NOT NULL) AS token_seconds,
            groupArray(intDiv(toUnixTimestamp64Nano(Timestamp) - {{start_ns:Int64}}, {{bucket_ns:Int64}}))
                AS bucket_ids
        FROM {table_name(client)} FINAL WHERE {where}
        GROUP BY PoolId ORDER BY PoolId
        """,
        params,
    )
    result = []
    for r in rows:
        timeline = [0] * buckets
        for b in r["bucket_ids"]:
            timeline[min(max(int(b), 0), buckets - 1)] += 1
        executed_n = r["ok"] + r["errors"]
        attempts_n = executed_n + r["retries"]
        result.append(
            PoolStats(
                pool=r["pool"],
                group=r["group"],
                count=r["count"],
                ok=r["ok"],
                errors=r["errors"],
                dropped=r["dropped"],
                error_rate=(r["errors"] / executed_n) if executed_n else None,
                queue_wait=_quantiles(r["queue_wait"]),
                execution=_quantiles(r["execution"]),
                total=_quantiles(r["total"]),
                tokens_per_s=(r["out_tokens"] / r["token_seconds"]) if r["token_seconds"] else None,
                timeline=timeline,
                retries=r["retries"],
                requeues=r["requeues"],
                dead_letters=r["dead_letters"],
                retry_rate=(r["retries"] / attempts_n) if attempts_n else None,
            )
        )
    return result


def stream_status(redis_client: Any, keys: Any) -> dict[str, int | None]:
    """Backlog of the span stream and how many spans its cap discarded before they were stored."""
    from history.ingester import GROUP

    stream = keys.span_stream()
    length = int(redis_client.xlen(stream))
    try:
        pending = int(redis_client.xpending(stream, GROUP)["pending"])
    except Exception:  # no group yet: nothing is pending
        pending = 0
    trimmed = int(redis_client.get(keys.span_trim_counter()) or 0)
    return {"length": length, "pending": pending, "trimmed": trimmed}
