"""The recorded arrivals of a fabric group, for a what-if replay (:mod:`runtime.whatif`).

One row per request that reached a pool of the group in the window, read from ``otel_traces`` by
its time partitions (the request's enqueue time is the span's start, ``Timestamp``):

* executed requests (dispatcher spans with status ok or error): pool, tenant (``llm_dispatch.tenant``:
  whom the request was fair to inside its pool, when it had one), cost units, tokens, queue wait and
  execution time;
* requests refused at admission (producer spans with status ``rejected``; they carry no group, so
  they are matched by the group's pool ids): pool, tenant and time only -- the replay decides whether the
  proposed configuration would have let them in.

Not read: drops (producer gone, expired) and intermediate attempts (``retry``, ``requeued``); a
retried request appears once, with its final attempt.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from history.client import HistoryClient
from history.schema import table_name
from runtime.telemetry import semconv
from runtime.whatif.trace import Arrival, Trace, TraceTooLarge

__all__ = ["MAX_WINDOW", "whatif_trace"]

MAX_WINDOW = timedelta(hours=24)
CHUNK = timedelta(minutes=10)  # one query per slice of the window

_SQL = f"""
SELECT toUnixTimestamp64Nano(Timestamp) AS ts_ns, PoolId AS pool, Status AS status,
    SpanAttributes['{semconv.TENANT}'] AS tenant,
    toInt64OrZero(SpanAttributes['{semconv.COST_UNITS}']) AS cost,
    ExecutionS AS execution_s, QueueWaitS AS queue_wait_s,
    ifNull(InputTokens, 0) AS input_tokens, ifNull(OutputTokens, 0) AS output_tokens
FROM {{table}}
WHERE Timestamp >= fromUnixTimestamp64Nano({{since:Int64}})
  AND Timestamp < fromUnixTimestamp64Nano({{until:Int64}})
  AND ((FabricGroup = {{group:String}} AND Status IN ('ok', 'error'))
       OR (Status = 'rejected' AND PoolId IN {{pools:Array(String)}}))
ORDER BY Timestamp
"""


def _ns(moment: datetime) -> int:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1_000_000) * 1000


def _arrival(row: dict[str, Any]) -> Arrival:
    refused = row["status"] == "rejected"
    return Arrival(
        enqueued_at=row["ts_ns"] / 1e9,
        pool_id=row["pool"],
        cost=max(0, int(row["cost"] or 0)),  # a refusal's span has none: 0, the replay borrows one
        execution_s=None if refused else row["execution_s"],
        queue_wait_s=None if refused else row["queue_wait_s"],
        tenant=row["tenant"] or "",
        input_tokens=int(row["input_tokens"]),
        output_tokens=int(row["output_tokens"]),
        refused=refused,
    )


def whatif_trace(
    *, client: HistoryClient, group: str, pool_ids: list[str], since: datetime, until: datetime
) -> Trace:
    """The group's requests enqueued in ``[since, until)`` (at most :data:`MAX_WINDOW`) as a trace.

    Read in slices of :data:`CHUNK` in time order, each slice's rows appended to the trace's arrays
    as they come: memory holds the arrays and one slice, never the whole window's rows.
    Raises :class:`~runtime.whatif.trace.TraceTooLarge` when the window holds more requests than a
    replay takes, and ``HistoryUnavailable`` when ClickHouse cannot be read.
    """
    since = max(since, until - MAX_WINDOW)
    sql = _SQL.replace("{table}", table_name(client))
    trace, last_launch = Trace(), None
    slice_start = since
    while slice_start < until:
        slice_end = min(until, slice_start + CHUNK)
        params = {"since": _ns(slice_start), "until": _ns(slice_end), "group": group, "pools": pool_ids}
        for row in client.query(sql, params):
            arrival = _arrival(row)
            try:
                trace.append(arrival)
            except TraceTooLarge as exc:
                minutes = (until - since).total_seconds() / 60
                raise TraceTooLarge(f"the last {minutes:.0f} minutes hold too many requests: {exc}") from exc
            if arrival.execution_s is not None:
                launch = arrival.enqueued_at + (arrival.queue_wait_s or 0.0)
                last_launch = launch if last_launch is None else max(last_launch, launch)
        slice_start = slice_end
    # The window starts at its first request (an hour asked of a demo started ten minutes ago means
    # those ten minutes) and ends where dispatch was last seen: after that, dispatchers were stopping
    # (a demo's end) or spans were still on their way to the ingester, and history has nothing for
    # the replay's later launches to be compared with.
    end = until.timestamp() if last_launch is None else min(until.timestamp(), last_launch)
    return trace.close(end=end)
