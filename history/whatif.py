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

from collections.abc import Sequence
from contextlib import closing
from datetime import UTC, datetime, timedelta
from typing import Any

from history.client import HistoryClient
from history.schema import table_name
from runtime.telemetry import semconv
from runtime.whatif.trace import Trace, TraceTooLarge

__all__ = ["MAX_WINDOW", "whatif_trace"]

MAX_WINDOW = timedelta(hours=24)
BLOCK_ROWS = 16_384  # rows a block of the streamed result holds (a few MB of Python values)

# One query for the window, read as columns streamed in blocks: a row dict and an Arrival per request
# cost five times the query itself (an hour of demo traffic: 0.3 s against 0.05 s). A refusal's times
# are NULL: it never ran (its span's execution time is the producer's, not a call's).
_SQL = f"""
SELECT toUnixTimestamp64Nano(Timestamp) AS ts_ns, PoolId AS pool, Status = 'rejected' AS refused,
    SpanAttributes['{semconv.TENANT}'] AS tenant,
    toInt64OrZero(SpanAttributes['{semconv.COST_UNITS}']) AS cost,
    if(refused, NULL, ExecutionS) AS execution_s, if(refused, NULL, QueueWaitS) AS queue_wait_s,
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


def _last_launch(block: dict[str, Sequence[Any]]) -> float | None:
    """The latest launch (enqueue + queue wait) of the block's executed requests, in seconds."""
    launches = [
        ts / 1e9 + (wait or 0.0)
        for ts, run, wait in zip(block["ts_ns"], block["execution_s"], block["queue_wait_s"], strict=True)
        if run is not None
    ]
    return max(launches, default=None)


def whatif_trace(
    *, client: HistoryClient, group: str, pool_ids: list[str], since: datetime, until: datetime
) -> Trace:
    """The group's requests enqueued in ``[since, until)`` (at most :data:`MAX_WINDOW`) as a trace.

    Read in blocks of :data:`BLOCK_ROWS` in time order, each block's columns appended to the trace's
    arrays as they come: memory holds the arrays and one block, never the whole window's rows.
    Raises :class:`~runtime.whatif.trace.TraceTooLarge` when the window holds more requests than a
    replay takes, and ``HistoryUnavailable`` when ClickHouse cannot be read.
    """
    since = max(since, until - MAX_WINDOW)
    sql = _SQL.replace("{table}", table_name(client))
    params = {"since": _ns(since), "until": _ns(until), "group": group, "pools": pool_ids}
    trace, last_launch = Trace(), None
    with closing(client.column_blocks(sql, params, block_rows=BLOCK_ROWS)) as blocks:
        for block in blocks:
            try:
                trace.extend(
                    enqueued_at=[ts / 1e9 for ts in block["ts_ns"]],
                    pool_ids=block["pool"],
                    tenants=block["tenant"],
                    cost=block["cost"],  # a refusal's span has none: 0, the replay borrows one
                    execution_s=block["execution_s"],
                    queue_wait_s=block["queue_wait_s"],
                    input_tokens=block["input_tokens"],
                    output_tokens=block["output_tokens"],
                    refused=block["refused"],
                )
            except TraceTooLarge as exc:
                minutes = (until - since).total_seconds() / 60
                raise TraceTooLarge(f"the last {minutes:.0f} minutes hold too many requests: {exc}") from exc
            launch = _last_launch(block)
            if launch is not None:
                last_launch = launch if last_launch is None else max(last_launch, launch)
    # The window starts at its first request (an hour asked of a demo started ten minutes ago means
    # those ten minutes) and ends where dispatch was last seen: after that, dispatchers were stopping
    # (a demo's end) or spans were still on their way to the ingester, and history has nothing for
    # the replay's later launches to be compared with.
    end = until.timestamp() if last_launch is None else min(until.timestamp(), last_launch)
    return trace.close(end=end)
