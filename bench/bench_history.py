"""History at scale: ingest rate of the real ingester, and each history page's p50 as rows grow.

Data: synthetic but shaped like production (4 pools in 2 fabric groups, 20 producers, 3 models,
lognormal queue wait and execution, 1 % errors, 0.5 % drops, a producer span and a dispatcher span per
request), spread evenly over the last 7 days and generated inside ClickHouse with ``INSERT ... SELECT
FROM numbers()`` into ``otel_traces``, so the materialized views fill the narrow tables exactly as the
ingester's inserts do. Each size adds rows to the same database (1 M, then 9 M more for 10 M, ...).

Pages: the Django views over the test client (full view, template and middleware stack, a logged-in
staff user, no socket), each run ``--runs`` times after one warm-up; p50 reported. Baseline, same run:
the query shapes of the previous history code (no time bound, per-execution sparkline array, exact
quantiles over raw rows; without its ``FINAL``, which the new MergeTree table refuses), at the sizes
where they finish in reasonable time.

Ingest: a real :class:`history.ingester.Ingester` draining a real Valkey stream prefilled with span
entries (the stored shape of the factories in ``tests/history``), default batch size, into an empty
database; spans/s and process CPU per 1,000 spans (``time.process_time``: Python plus chDB threads),
against one dispatcher's span rate (3,000 spans/s, issue 14).

Run: ``python bench/bench_history.py`` (1 M and 10 M rows, ~4 min) or
``python bench/bench_history.py --rows 1000000,10000000,100000000`` (adds 100 M; ~1 h on 2 busy cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine, private_valkey, scratch, table

DISPATCHER_SPANS_PER_S = 3000  # one dispatcher at full rate (issue 14)
DAYS = 7

_GENERATE = """
INSERT INTO {table} (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
    ResourceAttributes, ScopeName, SpanAttributes, Duration, StatusCode)
SELECT
    fromUnixTimestamp64Nano(toInt64({t0_ns} + k * {step_ns} + role * 2000000)) AS Timestamp,
    lower(concat(hex(cityHash64(k, 'a')), hex(cityHash64(k, 'b')))) AS TraceId,
    lower(hex(cityHash64(n, 's'))) AS SpanId,
    if(role = 1, lower(hex(cityHash64(k * 2, 's'))), '') AS ParentSpanId,
    if(role = 1, concat('chat ', model), 'llm_dispatch.submit') AS SpanName,
    if(role = 1, 'Client', 'Producer') AS SpanKind,
    if(role = 1, 'llm-dispatch-dispatcher', 'llm-dispatch-producer') AS ServiceName,
    map('service.name', ServiceName) AS ResourceAttributes,
    'llm_dispatch' AS ScopeName,
    if(role = 1,
        map('llm_dispatch.request_id', rid, 'llm_dispatch.pool_id', pool,
            'llm_dispatch.fabric_group', grp, 'llm_dispatch.producer_id', producer,
            'llm_dispatch.gateway_id', 'gw-1', 'llm_dispatch.dispatcher_id', concat('disp-', toString(k % 2)),
            'llm_dispatch.status', status, 'error.type', if(status = 'error', 'backend_error', ''),
            'llm_dispatch.drop_reason', if(status = 'dropped', 'producer_offline', ''),
            'gen_ai.request.model', model, 'gen_ai.response.model', model,
            'llm_dispatch.queue_wait_s', toString(wait), 'llm_dispatch.execution_s', toString(exec),
            'llm_dispatch.total_s', toString(wait + exec),
            'gen_ai.usage.input_tokens', toString(100 + k % 900),
            'gen_ai.usage.output_tokens', toString(20 + k % 400),
            'llm_dispatch.backend_url', 'http://10.0.0.5:8000/v1', 'gen_ai.operation.name', 'chat',
            'llm_dispatch.message_count', '3'),
        map('llm_dispatch.request_id', rid, 'llm_dispatch.producer_id', producer,
            'llm_dispatch.pool_id', pool)) AS SpanAttributes,
    toUInt64(if(role = 1, exec, wait + exec) * 1e9) AS Duration,
    if(status = 'error' AND role = 1, 'Error', 'Unset') AS StatusCode
FROM (
    SELECT number AS n, intDiv(number, 2) AS k, number % 2 AS role,
        concat('req-', lower(hex(cityHash64(k, 'r')))) AS rid,
        ['interactive', 'batch', 'backfill', 'eval'][1 + cityHash64(k, 'p') % 4] AS pool,
        if(pool IN ('interactive', 'batch'), 'g-online', 'g-offline') AS grp,
        concat('producer-', toString(cityHash64(k, 'q') % 20)) AS producer,
        ['m-small', 'm-large', 'm-vision'][1 + cityHash64(k, 'm') % 3] AS model,
        multiIf(cityHash64(k, 'e') % 1000 < 10, 'error', cityHash64(k, 'e') % 1000 < 15, 'dropped', 'ok')
            AS status,
        round(randLogNormal(-3.0, 1.2), 6) AS wait,
        if(status = 'dropped', 0, round(randLogNormal(0.0, 0.6), 6)) AS exec
    FROM numbers({offset}, {count})
)
"""


def _setup_django(data_dir: Path, valkey_url: str) -> None:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="dispatch_project.settings",
        DISPATCH_DATA_DIR=str(data_dir),
        CLICKHOUSE_URL=f"chdb://{data_dir / 'clickhouse'}",
        DATABASE_URL=f"sqlite:///{data_dir / 'db.sqlite3'}",
        VALKEY_URL=valkey_url,
        DISPATCH_LOG_LEVEL="WARNING",
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _staff_client() -> Any:
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.create_user("bench", password="x", is_staff=True))
    return client


def _p50_ms(call: Callable[[], Any], runs: int) -> float:
    call()  # warm-up: first read of the parts' marks and indexes
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _generate(client: Any, start_row: int, end_row: int, t0_ns: int, step_ns: int) -> float:
    from history import schema

    chunk = 5_000_000
    started = time.perf_counter()
    for offset in range(start_row, end_row, chunk):
        count = min(chunk, end_row - offset)
        client.command(
            _GENERATE.format(
                table=schema.table_name(client), t0_ns=t0_ns, step_ns=step_ns, offset=offset, count=count
            )
        )
    return time.perf_counter() - started


def _settle(client: Any, timeout_s: float = 300.0) -> float:
    """Waits until no background merge runs (a steady state, as hours after a load); returns seconds."""
    started = time.perf_counter()
    quiet = 0
    while quiet < 3 and time.perf_counter() - started < timeout_s:
        busy = client.query("SELECT count() AS n FROM system.merges")[0]["n"]
        quiet = quiet + 1 if busy == 0 else 0
        time.sleep(1.0)
    return time.perf_counter() - started


def _disk(client: Any) -> tuple[int, int]:
    """(bytes of otel_traces, bytes of every history table) on disk, active parts."""
    rows = client.query(
        "SELECT table, sum(bytes_on_disk) AS b FROM system.parts "
        "WHERE database = {db:String} AND active GROUP BY table",
        {"db": client.database},
    )
    sizes = {r["table"]: int(r["b"]) for r in rows}
    return sizes.get("otel_traces", 0), sum(sizes.values())


def _request_ids(client: Any) -> tuple[str, str]:
    from history import schema

    t = schema.table_name(client, schema.EXECUTIONS)
    new = client.query(f"SELECT RequestId AS r FROM {t} ORDER BY Timestamp DESC LIMIT 1")[0]["r"]
    old = client.query(
        f"SELECT RequestId AS r FROM {t} WHERE Timestamp < now() - INTERVAL 6 DAY "
        "ORDER BY Timestamp DESC LIMIT 1"
    )[0]["r"]
    return new, old


def _legacy_queries(client: Any) -> dict[str, Callable[[], Any]]:
    """The previous code's query shapes (minus FINAL) against the same rows."""
    from history import queries, schema

    t = schema.table_name(client)
    since = int((datetime.now(UTC) - timedelta(days=DAYS)).timestamp() * 1e9)
    return {
        "recent (old)": lambda: client.query(
            f"SELECT {queries._ROW_COLUMNS} "
            f"FROM {t} WHERE Status != '' ORDER BY Timestamp DESC, SpanId LIMIT 51"
        ),
        "pools 7d (old)": lambda: client.query(
            f"SELECT PoolId, count(), quantilesExactInclusiveIf(0.5, 0.95, 0.99)(QueueWaitS, Status IN "
            f"('ok', 'error')), quantilesExactInclusiveIf(0.5, 0.95, 0.99)(ExecutionS, Status IN "
            f"('ok', 'error')), quantilesExactInclusiveIf(0.5, 0.95, 0.99)(TotalS, Status IN ('ok', "
            f"'error')), groupArray(intDiv(toUnixTimestamp64Nano(Timestamp) - {since}, 25200000000000)) "
            f"FROM {t} WHERE Status != '' AND Timestamp >= fromUnixTimestamp64Nano({since}) GROUP BY PoolId"
        ),
    }


def _pages(web: Any, new_rid: str, old_rid: str) -> dict[str, Callable[[], Any]]:
    def get(url: str, params: dict[str, str] | None = None) -> Callable[[], Any]:
        def call() -> Any:
            response = web.get(url, params or {})
            assert response.status_code == 200, (url, params, response.status_code)
            return response

        return call

    return {
        "recent (last 1h)": get("/history/"),
        "recent filtered (pool+status, 1h)": get("/history/", {"pool": "batch", "status": "error"}),
        "recent page 20 (1h)": get("/history/", {"page": "20"}),
        "recent filtered 7d (producer)": get("/history/", {"window": "7d", "producer": "producer-7"}),
        "recent all history": get("/history/", {"window": "all"}),
        "detail (newest request)": get(f"/history/request/{new_rid}/"),
        "detail (6-day-old request)": get(f"/history/request/{old_rid}/"),
        "pools 1h": get("/history/pools/"),
        "pools 1h exact": get("/history/pools/", {"exact": "on"}),
        "pools 24h": get("/history/pools/", {"window": "24h"}),
        "pools 7d": get("/history/pools/", {"window": "7d"}),
    }


def bench_pages(sizes: Sequence[int], runs: int, legacy_max: int) -> list[dict[str, Any]]:
    from history import schema
    from history.client import history_client

    results = []
    with private_valkey() as valkey_url, scratch() as data_dir:
        _setup_django(data_dir, valkey_url)
        client = history_client()
        schema.migrate(client, retention_days=30)
        web = _staff_client()
        end_ns = time.time_ns()
        made = 0
        for size in sizes:
            # The rows added for this size spread over the same 7 days, interleaving with earlier ones.
            gen_s = 0.0
            if size > made:
                step_ns = DAYS * 86400 * 10**9 // max(1, (size - made) // 2)
                t0_ns = end_ns - DAYS * 86400 * 10**9 - made // 2 * step_ns
                gen_s = _generate(client, made, size, t0_ns, step_ns)
            made = size
            settle_s = _settle(client)
            new_rid, old_rid = _request_ids(client)
            timings = {name: _p50_ms(call, runs) for name, call in _pages(web, new_rid, old_rid).items()}
            if size <= legacy_max:
                timings.update(
                    {name: _p50_ms(q, max(3, runs // 2)) for name, q in _legacy_queries(client).items()}
                )
            main_bytes, all_bytes = _disk(client)
            result = {
                "rows": size,
                "generate_s": gen_s,
                "settle_s": settle_s,
                "pages": timings,
                "disk": (main_bytes, all_bytes),
            }
            results.append(result)
            _print_size(result)
    return results


def _print_size(result: dict[str, Any]) -> None:
    rows = result["rows"]
    main_bytes, all_bytes = result["disk"]
    per_m = rows / 1e6
    print(
        f"\n{rows:,} rows (generated in {result['generate_s']:.0f} s, merges settled in "
        f"{result['settle_s']:.0f} s); disk: otel_traces "
        f"{main_bytes / per_m / 1e6:.1f} MB per million rows, all history tables "
        f"{all_bytes / per_m / 1e6:.1f} MB per million rows ({all_bytes / 1e9:.2f} GB in all)"
    )
    print(
        table(["page", "p50 ms"], [(name, f"{ms:.1f}") for name, ms in result["pages"].items()]), flush=True
    )


def bench_ingest(spans: int, runs: int) -> dict[str, float]:
    from bench.bench_ingest import child_drain
    from history.client import close_all

    rates, cpus = [], []
    with private_valkey() as valkey_url, scratch() as data_dir:
        for run in range(runs):
            result = child_drain(valkey_url, str(data_dir / f"ingest-{run}"), spans)
            close_all()
            rates.append(result["spans_per_s"])
            cpus.append(result["cpu_ms_per_1000"])
    rate, cpu_ms = statistics.median(rates), statistics.median(cpus)
    print(
        f"\ningest: {rate:,.0f} spans/s (runs: {', '.join(f'{r:,.0f}' for r in rates)}), "
        f"{cpu_ms:.1f} ms CPU per 1,000 spans; {rate / DISPATCHER_SPANS_PER_S:.1f}x one dispatcher's "
        f"{DISPATCHER_SPANS_PER_S:,} spans/s",
        flush=True,
    )
    return {"spans_per_s": rate, "cpu_ms_per_1000": cpu_ms, "ratio": rate / DISPATCHER_SPANS_PER_S}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1000000,10000000", help="comma-separated sizes, ascending")
    parser.add_argument("--runs", type=int, default=7, help="timed requests per page and size")
    parser.add_argument("--legacy-max", type=int, default=10_000_000, help="largest size for the baseline")
    parser.add_argument("--ingest-spans", type=int, default=100_000)
    parser.add_argument("--ingest-runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="100,000 rows, 3 runs, 10,000 ingested spans")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.runs, args.ingest_spans, args.ingest_runs = "100000", 3, 10_000, 1
    sizes = sorted(int(s) for s in args.rows.split(","))
    print(machine(), flush=True)
    ingest = bench_ingest(args.ingest_spans, args.ingest_runs)
    pages = bench_pages(sizes, args.runs, args.legacy_max)
    return {"ingest": ingest, "pages": pages}


if __name__ == "__main__":
    main()
