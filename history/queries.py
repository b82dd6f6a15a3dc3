"""Selectors over the history tables; none reads with ``FINAL`` (inserts are deduplicated instead).

An *execution* is a dispatcher span: a row whose ``llm_dispatch.status`` attribute is set (ok, error or
dropped). Producer spans share its trace and appear in the request's detail. Each page reads the table
laid out for it (see ``history.schema``): the recent list reads executions newest first in sorting-key
order, the detail page finds a request by its id key, the analytics read per-minute aggregates.

Percentiles, approximate (the default): DDSketch states per pool and minute (per hour beyond
``HOURLY_FROM``), merged over the window, which is widened to whole minutes (hours); each value is
within 2 % (``schema.STATED_ACCURACY``) of the value at that rank. Exact (``exact=True``, for short
windows): ClickHouse's ``quantilesExactInclusive``: for the sorted values x[0..n-1] and level p, with
h = (n - 1) * p, the result is x[floor h] + (h - floor h) * (x[floor h + 1] - x[floor h]) (numpy's
default "linear" method). Latency percentiles cover executed requests (status ok or error: a request's
final attempt), not drops. Error rate is errors / (ok + errors). Tokens per second is output tokens
divided by execution seconds, summed over successful executions that reported tokens.

An attempt that failed and was scheduled again has status ``retry``; a durable request put back after
its dispatcher's lease expired has status ``requeued``; a dead letter's final span has error type
``dead_lettered``. Retry rate is retry / (ok + errors + retry): the share of backend attempts that
failed transiently and ran again. These three counts are read from the executions table (exact).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from history import schema
from history.client import HistoryClient
from history.schema import table_name
from runtime.telemetry import semconv

LEVELS = schema.QUANTILE_LEVELS
STATUSES = ("ok", "error", "dropped", "retry", "requeued")
DEAD_LETTERED = "dead_lettered"
# Exact percentiles read every execution of the window: offered for windows up to this long.
EXACT_MAX_WINDOW = timedelta(hours=1)
# Approximate analytics over longer windows read the hourly roll-up (window widened to whole hours).
HOURLY_FROM = timedelta(hours=6)
# Spans of a request's trace without its request id (other services' spans) fall within this margin.
TRACE_MARGIN_S = 300

_FILTER_COLUMNS = {name: col for name, col in schema.FILTER_COLUMNS.items() if name != "model"}

_ROW_COLUMNS = """
    toUnixTimestamp64Nano(Timestamp) AS ts_ns, RequestId AS request_id, TraceId AS trace_id,
    SpanId AS span_id,
    FabricGroup AS group, PoolId AS pool, ProducerId AS producer, GatewayId AS gateway,
    DispatcherId AS dispatcher, Status AS status, ErrorType AS error_type, DropReason AS drop_reason,
    RequestModel AS model, ResponseModel AS response_model, QueueWaitS AS queue_wait_s,
    ExecutionS AS execution_s, TotalS AS total_s, InputTokens AS input_tokens, OutputTokens AS output_tokens,
    ProducerLabel AS producer_label, TimeToFirstTokenS AS time_to_first_token_s, ChunkCount AS chunk_count
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


def where_clause(filters: ExecutionFilter) -> tuple[str, dict[str, Any]]:
    clauses, params = ["1"], {}
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
    """Newest executions first, filtered and paged; reads the time-sorted table in key order."""
    page, page_size = max(1, page), max(1, min(page_size, 500))
    where, params = where_clause(filters)
    rows = client.query(
        f"SELECT {_ROW_COLUMNS} FROM {table_name(client, schema.EXECUTIONS)} WHERE {where} "
        f"ORDER BY Timestamp DESC, SpanId DESC LIMIT {page_size + 1} OFFSET {(page - 1) * page_size}",
        params,
    )
    return Page([_row(r) for r in rows[:page_size]], page, page_size, len(rows) > page_size)


def executions_exist(*, client: HistoryClient) -> bool:
    """Whether any execution is stored (reads one granule)."""
    return bool(client.query(f"SELECT 1 AS one FROM {table_name(client, schema.EXECUTIONS)} LIMIT 1"))


def filter_choices(*, client: HistoryClient, since: datetime | None = None) -> dict[str, list[str]]:
    """Values for the filter form's drop-downs: those seen since ``since`` (all when None), 200 each."""
    params: dict[str, Any] = {"since": int(since.timestamp()) if since is not None else 0}
    rows = client.query(
        f"SELECT Name AS name, Value AS value FROM {table_name(client, schema.FILTER_VALUES)} "
        "GROUP BY Name, Value HAVING max(LastSeen) >= toDateTime({since:Int64}) "
        "ORDER BY Name, Value LIMIT 200 BY Name",
        params,
    )
    choices: dict[str, list[str]] = {name: [] for name in schema.FILTER_COLUMNS}
    for r in rows:
        if r["name"] in choices:
            choices[r["name"]].append(r["value"])
    return choices


_SPAN_COLUMNS = (
    "SpanName AS name, SpanKind AS kind, ServiceName AS service, ParentSpanId AS parent_span_id, "
    "Duration AS duration_ns, StatusCode AS status_code, StatusMessage AS status_message, "
    "SpanAttributes AS attributes, ResourceAttributes AS resource"
)


def execution_detail(*, client: HistoryClient, request_id: str) -> dict[str, Any] | None:
    """One request: its dispatcher span(s) (attempts, newest last) and every span of its trace.

    Two key lookups, no scan: request id -> trace ids and time range (``llm_dispatch_request_ids``),
    then the spans by time range (widened by ``TRACE_MARGIN_S`` for spans of the trace that carry no
    request id) and trace id.
    """
    traces = client.query(
        f"SELECT TraceId AS trace_id, toUnixTimestamp(min(Start)) AS start, toUnixTimestamp(max(End)) AS end "
        f"FROM {table_name(client, schema.REQUEST_IDS)} WHERE RequestId = {{rid:String}} "
        "GROUP BY TraceId ORDER BY end",
        {"rid": request_id},
    )
    if not traces:
        return None
    trace_ids = [t["trace_id"] for t in traces]
    spans = client.query(
        f"SELECT {_ROW_COLUMNS}, Attempt AS attempt, {_SPAN_COLUMNS} FROM {table_name(client)} "
        "WHERE TraceId IN {tids:Array(String)} "
        "AND toDateTime(Timestamp) BETWEEN toDateTime({start:Int64}) AND toDateTime({end:Int64}) "
        "ORDER BY Timestamp",
        {
            "tids": trace_ids,
            "start": min(int(t["start"]) for t in traces) - TRACE_MARGIN_S,
            "end": max(int(t["end"]) for t in traces) + TRACE_MARGIN_S + 1,
        },
    )
    spans = [_row(s) for s in spans]
    executions = attempt_chain([s for s in spans if s["status"] and s["request_id"] == request_id])
    mine = [s for s in spans if s["request_id"] == request_id]
    if not mine:
        return None
    main = executions[-1] if executions else mine[-1]
    trace = [s for s in spans if s["trace_id"] == main["trace_id"]]
    return {"execution": main, "attempts": executions, "trace": trace}


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


def _redelivery(
    client: HistoryClient, since: datetime, until: datetime, group: str, stats: list[PoolStats]
) -> list[PoolStats]:
    """Fills in each pool's retries, requeues, dead letters and retry rate over the window."""
    where, params = where_clause(ExecutionFilter(group=group, since=since, until=until))
    rows = client.query(
        "SELECT PoolId AS pool, countIf(Status = 'retry') AS retries, "
        f"countIf(Status = 'requeued') AS requeues, countIf(ErrorType = '{DEAD_LETTERED}') AS dead_letters "
        f"FROM {table_name(client, schema.EXECUTIONS)} WHERE {where} GROUP BY PoolId",
        params,
    )
    counts = {r["pool"]: r for r in rows}
    for pool in stats:
        found = counts.get(pool.pool)
        if found is None:
            continue
        pool.retries, pool.requeues, pool.dead_letters = (
            found["retries"],
            found["requeues"],
            found["dead_letters"],
        )
        attempts = pool.ok + pool.errors + pool.retries
        pool.retry_rate = pool.retries / attempts if attempts else None
    return stats


def _quantiles(values: list[float] | None) -> dict[float, float | None]:
    values = values or []
    return {
        level: (None if i >= len(values) or math.isnan(values[i]) else float(values[i]))
        for i, level in enumerate(LEVELS)
    }


def _stats(r: dict[str, Any], timeline: list[int]) -> PoolStats:
    executed_n = r["ok"] + r["errors"]
    return PoolStats(
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
    )


def _timelines(rows: list[dict[str, Any]], buckets: int) -> dict[str, list[int]]:
    lines: dict[str, list[int]] = {}
    for r in rows:
        line = lines.setdefault(r["pool"], [0] * buckets)
        line[min(max(int(r["bucket"]), 0), buckets - 1)] += int(r["n"])
    return lines


def pool_analytics(
    *,
    client: HistoryClient,
    since: datetime,
    until: datetime,
    group: str = "",
    buckets: int = 24,
    exact: bool = False,
) -> list[PoolStats]:
    """Per-pool counts, error rate, p50/p95/p99 of queue wait, execution and total, tokens/s, timeline.

    Approximate (default) reads the per-minute aggregates, its cost independent of traffic; ``exact``
    reads every execution of the window (see the module docstring for both definitions).
    """
    if exact:
        return _redelivery(
            client, since, until, group, _exact_analytics(client, since, until, group, buckets)
        )
    hourly = until - since > HOURLY_FROM
    grain, table, period = (
        (3600, schema.POOL_HOURS, "Hour") if hourly else (60, schema.POOL_MINUTES, "Minute")
    )
    start_s = int(since.timestamp()) // grain * grain
    end_s = int(until.timestamp())
    # Timeline buckets are whole periods of the table's grain.
    buckets = max(1, min(buckets, math.ceil((end_s - start_s) / grain)))
    params: dict[str, Any] = {
        "start": start_s,
        "end": end_s,
        "group": group,
        "bucket_s": math.ceil((end_s - start_s) / buckets / grain) * grain,
    }
    where = f"{period} >= toDateTime({{start:Int64}}) AND {period} <= toDateTime({{end:Int64}})"
    if group:
        where += " AND FabricGroup = {group:String}"
    merge = schema.SKETCH_ACCURACY, ", ".join(str(q) for q in LEVELS)
    dd = f"quantilesDDMerge({merge[0]}, {merge[1]})"
    source = table_name(client, table)
    rows = client.query(
        f"""
        SELECT PoolId AS pool, any(FabricGroup) AS group, sum(Executions) AS count, sum(Ok) AS ok,
            sum(Errors) AS errors, sum(Dropped) AS dropped,
            {dd}(QueueWait) AS queue_wait, {dd}(Execution) AS execution, {dd}(Total) AS total,
            sum(RateOutputTokens) AS out_tokens, sum(RateSeconds) AS token_seconds
        FROM {source} WHERE {where} GROUP BY PoolId ORDER BY PoolId
        """,
        params,
    )
    points = client.query(
        f"SELECT PoolId AS pool, intDiv(toUnixTimestamp({period}) - {{start:Int64}}, {{bucket_s:Int64}}) "
        f"AS bucket, sum(Executions) AS n FROM {source} WHERE {where} GROUP BY pool, bucket",
        params,
    )
    lines = _timelines(points, buckets)
    stats = [_stats(r, lines.get(r["pool"], [0] * buckets)) for r in rows]
    return _redelivery(client, since, until, group, stats)


def _exact_analytics(
    client: HistoryClient, since: datetime, until: datetime, group: str, buckets: int
) -> list[PoolStats]:
    where, params = where_clause(ExecutionFilter(group=group, since=since, until=until))
    levels = ", ".join(str(level) for level in LEVELS)
    executed = "Status IN ('ok', 'error')"
    span_ns = max(1, _ns(until) - _ns(since))
    params.update({"bucket_ns": math.ceil(span_ns / buckets), "start_ns": _ns(since)})
    source = table_name(client, schema.EXECUTIONS)
    rows = client.query(
        f"""
        SELECT PoolId AS pool, any(FabricGroup) AS group, count() AS count,
            countIf(Status = 'ok') AS ok, countIf(Status = 'error') AS errors,
            countIf(Status = 'dropped') AS dropped,
            quantilesExactInclusiveIf({levels})(QueueWaitS, {executed}) AS queue_wait,
            quantilesExactInclusiveIf({levels})(ExecutionS, {executed}) AS execution,
            quantilesExactInclusiveIf({levels})(TotalS, {executed}) AS total,
            sumIf(OutputTokens, Status = 'ok' AND ExecutionS > 0) AS out_tokens,
            sumIf(ExecutionS, Status = 'ok' AND ExecutionS > 0 AND OutputTokens IS NOT NULL) AS token_seconds
        FROM {source} WHERE {where} GROUP BY PoolId ORDER BY PoolId
        """,
        params,
    )
    points = client.query(
        "SELECT PoolId AS pool, "
        "intDiv(toUnixTimestamp64Nano(Timestamp) - {start_ns:Int64}, {bucket_ns:Int64}) AS bucket, "
        f"count() AS n FROM {source} WHERE {where} GROUP BY pool, bucket",
        params,
    )
    lines = _timelines(points, buckets)
    return [_stats(r, lines.get(r["pool"], [0] * buckets)) for r in rows]


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
