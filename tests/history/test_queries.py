"""history.queries against a real chDB engine, with exact expected values computed here."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from history import queries, schema
from history.client import HistoryClient
from history.queries import LEVELS, ExecutionFilter
from history.tenants import tenant_usage
from tests.support.history_spans import execution_doc, store


def exact_inclusive(values: list[float], p: float) -> float:
    """The stated definition: linear interpolation between closest ranks, h = (n - 1) * p."""
    xs = sorted(values)
    h = (len(xs) - 1) * p
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def _window() -> tuple[datetime, datetime]:
    now = datetime.now(UTC)
    return now - timedelta(hours=1), now + timedelta(seconds=5)


def test_percentiles_equal_exact_values(history: HistoryClient) -> None:
    rng = random.Random(7)
    waits = [round(rng.uniform(0, 5), 6) for _ in range(101)]
    execs = [round(rng.expovariate(1.0), 6) for _ in range(101)]
    docs = [execution_doc(pool="a", queue_wait=w, execution=e) for w, e in zip(waits, execs, strict=True)]
    docs += [execution_doc(pool="a", status="error", error_type="timeout", queue_wait=9.0, execution=2.0)]
    docs += [execution_doc(pool="a", status="dropped", queue_wait=99.0, execution=0.0)]  # not in latency
    store(history, docs)
    since, until = _window()
    (stats,) = queries.pool_analytics(client=history, since=since, until=until, exact=True)
    waits.append(9.0)
    execs.append(2.0)
    totals = [d["attributes"]["llm_dispatch.total_s"] for d in docs[:-1]]
    for level in LEVELS:
        assert stats.queue_wait[level] == pytest.approx(exact_inclusive(waits, level), rel=1e-12)
        assert stats.execution[level] == pytest.approx(exact_inclusive(execs, level), rel=1e-12)
        assert stats.total[level] == pytest.approx(exact_inclusive(totals, level), rel=1e-12)
    assert (stats.count, stats.ok, stats.errors, stats.dropped) == (103, 101, 1, 1)
    assert stats.error_rate == pytest.approx(1 / 102)
    assert stats.tokens_per_s == pytest.approx(101 * 100 / sum(execs[:101]))
    assert sum(stats.timeline) == 103


def test_small_known_percentiles(history: HistoryClient) -> None:
    store(history, [execution_doc(pool="p", queue_wait=float(v), execution=1.0) for v in (1, 2, 3, 4)])
    since, until = _window()
    (stats,) = queries.pool_analytics(client=history, since=since, until=until, exact=True)
    assert stats.queue_wait == {0.5: 2.5, 0.95: pytest.approx(3.85), 0.99: pytest.approx(3.97)}


def test_analytics_per_pool_and_window(history: HistoryClient) -> None:
    store(
        history,
        [
            execution_doc(pool="a"),
            execution_doc(pool="b", output_tokens=None),
            execution_doc(pool="b", group="g2", ago_s=7200),
        ],
    )
    since, until = _window()
    stats = {s.pool: s for s in queries.pool_analytics(client=history, since=since, until=until)}
    assert set(stats) == {"a", "b"} and stats["b"].count == 1
    assert stats["b"].tokens_per_s is None
    assert queries.pool_analytics(client=history, since=since, until=until, group="g2") == []


def test_tenant_usage_per_pool(history: HistoryClient) -> None:
    def doc(tenant: str, wait: float, **kw: Any) -> dict[str, Any]:
        kw = {"pool": "p", "input_tokens": 7, "output_tokens": 20, **kw}
        return execution_doc(tenant=tenant, queue_wait=wait, **kw)

    store(
        history,
        [
            *(doc("acme", float(w)) for w in (1, 2, 3, 4)),
            doc("acme", 50.0, status="dropped", output_tokens=None),  # a request, but no wait figure
            doc("acme", 60.0, status="retry"),  # an attempt, not a request
            doc("beta", 0.5),
            doc("beta", 1.5, status="error"),
            doc("beta", 9.0, ago_s=7200),  # outside the window
            doc("gamma", 1.0, pool="other"),
            execution_doc(pool="p", queue_wait=99.0),  # untagged
        ],
    )
    since, until = _window()
    rows = tenant_usage(client=history, since=since, until=until, pool="p")
    assert [(r["tenant"], r["requests"], r["input_tokens"], r["output_tokens"]) for r in rows] == [
        ("acme", 5, 28, 80),
        ("beta", 2, 14, 40),
    ]
    assert rows[0]["p50"] == 2.5 and rows[0]["p99"] == pytest.approx(3.97)
    assert rows[1]["p50"] == 1.0 and rows[1]["p99"] == pytest.approx(1.49)
    everywhere = tenant_usage(client=history, since=since, until=until, limit=1)
    assert [(r["pool"], r["tenant"]) for r in everywhere] == [("other", "gamma"), ("p", "acme")]


def test_empty_analytics(history: HistoryClient) -> None:
    since, until = _window()
    assert queries.pool_analytics(client=history, since=since, until=until) == []
    assert queries.executions_recent(client=history).rows == []
    assert queries.filter_choices(client=history)["pool"] == []


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        (ExecutionFilter(), {"r1", "r2", "r3", "r4"}),
        (ExecutionFilter(pool="b"), {"r2"}),
        (ExecutionFilter(group="g2"), {"r3"}),
        (ExecutionFilter(producer="p9"), {"r4"}),
        (ExecutionFilter(gateway="gw-2"), {"r2"}),
        (ExecutionFilter(status="error"), {"r3"}),
        (ExecutionFilter(error_type="timeout"), {"r3"}),
        (ExecutionFilter(model="m-large"), {"r4"}),
        (ExecutionFilter(since=datetime.now(UTC) - timedelta(minutes=30)), {"r1", "r2", "r3"}),
        (ExecutionFilter(until=datetime.now(UTC) - timedelta(minutes=30)), {"r4"}),
        (ExecutionFilter(pool="a", status="error"), set()),
    ],
)
def test_recent_filters(history: HistoryClient, flt: ExecutionFilter, expected: set[str]) -> None:
    store(
        history,
        [
            execution_doc(request_id="r1", pool="a"),
            execution_doc(request_id="r2", pool="b", gateway="gw-2"),
            execution_doc(request_id="r3", pool="c", group="g2", status="error", error_type="timeout"),
            execution_doc(request_id="r4", producer="p9", model="m-large", ago_s=3600),
        ],
    )
    page = queries.executions_recent(client=history, filters=flt)
    assert {r["request_id"] for r in page.rows} == expected


def test_recent_paging_newest_first(history: HistoryClient) -> None:
    store(history, [execution_doc(request_id=f"r{i:02d}", ago_s=100 - i) for i in range(25)])
    first = queries.executions_recent(client=history, page=1, page_size=10)
    last = queries.executions_recent(client=history, page=3, page_size=10)
    assert [r["request_id"] for r in first.rows][:2] == ["r24", "r23"]
    assert first.has_next and not first.has_previous
    assert [r["request_id"] for r in last.rows] == [f"r{i:02d}" for i in range(4, -1, -1)]
    assert not last.has_next and last.has_previous


def test_detail_includes_trace(history: HistoryClient) -> None:
    chat = execution_doc(request_id="rq", status="error", error_type="backend_error")
    producer_span = {
        "trace_id": chat["trace_id"],
        "span_id": "f" * 16,
        "name": "llm_dispatch.submit",
        "kind": "Producer",
        "start_ns": chat["start_ns"] - 1000,
        "end_ns": chat["end_ns"] + 1000,
        "attributes": {"llm_dispatch.request_id": "rq"},
        "resource": {"service.name": "llm-dispatch-producer"},
    }
    chat["parent_span_id"] = "f" * 16
    store(history, [chat, producer_span])
    detail = queries.execution_detail(client=history, request_id="rq")
    assert detail is not None
    assert detail["execution"]["status"] == "error" and detail["execution"]["error_type"] == "backend_error"
    assert detail["execution"]["trace_id"] == chat["trace_id"]
    assert [s["service"] for s in detail["trace"]] == ["llm-dispatch-producer", "llm-dispatch-dispatcher"]
    assert queries.execution_detail(client=history, request_id="nope") is None


def _value_band(values: list[float], p: float) -> tuple[float, float]:
    """The values at the ranks around level p (h = (n - 1) * p), widened by the stated accuracy."""
    xs = sorted(values)
    h = (len(xs) - 1) * p
    lo, hi = xs[math.floor(h)], xs[math.ceil(h)]
    alpha = schema.STATED_ACCURACY
    return lo * (1 - alpha), hi * (1 + alpha)


def test_approximate_analytics_match_exact_figures_within_the_stated_accuracy(history: HistoryClient) -> None:
    """The per-minute aggregates (materialized view) against figures computed here from the raw rows."""
    rng = random.Random(11)
    docs = []
    for i in range(1500):
        status = "error" if i % 97 == 0 else "dropped" if i % 131 == 0 else "ok"
        docs.append(
            execution_doc(
                pool=("a", "b")[i % 2],
                status=status,
                error_type="timeout" if status == "error" else "",
                queue_wait=round(rng.lognormvariate(-3, 1.2), 6),
                execution=round(rng.lognormvariate(0, 0.6), 6),
                output_tokens=rng.randint(1, 500),
                ago_s=rng.uniform(60, 3000),
            )
        )
    store(history, docs)
    since, until = _window()
    exact = {s.pool: s for s in queries.pool_analytics(client=history, since=since, until=until, exact=True)}
    minutes = queries.pool_analytics(client=history, since=since, until=until)
    hours = queries.pool_analytics(client=history, since=until - timedelta(days=1), until=until)  # roll-up
    assert [s.pool for s in minutes] == [s.pool for s in hours] == sorted(exact) == ["a", "b"]
    for stats in [*minutes, *hours]:
        pool = stats.pool
        mine = [d["attributes"] for d in docs if d["attributes"]["llm_dispatch.pool_id"] == pool]
        executed = [a for a in mine if a["llm_dispatch.status"] != "dropped"]
        statuses = [a["llm_dispatch.status"] for a in mine]
        assert (stats.count, stats.ok, stats.errors, stats.dropped) == (
            len(mine),
            statuses.count("ok"),
            statuses.count("error"),
            statuses.count("dropped"),
        )
        assert stats.error_rate == exact[pool].error_rate
        assert stats.tokens_per_s == pytest.approx(exact[pool].tokens_per_s, rel=1e-9)
        assert sum(stats.timeline) == len(mine)
        for attr, key in (
            ("queue_wait", "llm_dispatch.queue_wait_s"),
            ("execution", "llm_dispatch.execution_s"),
            ("total", "llm_dispatch.total_s"),
        ):
            values = [float(a[key]) for a in executed]
            for level in LEVELS:
                low, high = _value_band(values, level)
                assert low <= getattr(stats, attr)[level] <= high, (pool, attr, level)


def test_bounded_recent_list_returns_the_newest_rows_across_days(history: HistoryClient) -> None:
    store(
        history,
        [
            execution_doc(request_id="now", ago_s=30),
            execution_doc(request_id="hour-ago", ago_s=2 * 3600),
            execution_doc(request_id="days-ago", ago_s=3 * 86400),
            *(execution_doc(request_id=f"fill-{i}", ago_s=600 + i) for i in range(5)),
        ],
    )
    recent = queries.executions_recent(
        client=history, filters=ExecutionFilter(since=datetime.now(UTC) - timedelta(hours=1)), page_size=3
    )
    assert [r["request_id"] for r in recent.rows] == ["now", "fill-0", "fill-1"] and recent.has_next
    everything = queries.executions_recent(client=history, page=2, page_size=3)
    assert [r["request_id"] for r in everything.rows] == ["fill-2", "fill-3", "fill-4"]
    last = queries.executions_recent(client=history, page=3, page_size=3)
    assert [r["request_id"] for r in last.rows] == ["hour-ago", "days-ago"]
    choices = queries.filter_choices(client=history, since=datetime.now(UTC) - timedelta(hours=1))
    assert choices["pool"] == ["interactive"] and choices["status"] == ["ok"]


def test_filter_choices_only_show_values_seen_in_the_window(history: HistoryClient) -> None:
    store(history, [execution_doc(pool="fresh", ago_s=60), execution_doc(pool="stale", ago_s=2 * 86400)])
    day = queries.filter_choices(client=history, since=datetime.now(UTC) - timedelta(days=1))
    assert day["pool"] == ["fresh"]
    assert queries.filter_choices(client=history)["pool"] == ["fresh", "stale"]


def test_detail_finds_old_and_new_requests(history: HistoryClient) -> None:
    old = execution_doc(request_id="old-one", ago_s=6 * 86400, status="error", error_type="timeout")
    new = execution_doc(request_id="new-one", ago_s=5)
    store(history, [old, new, *(execution_doc(ago_s=i * 3600) for i in range(50))])
    found_old = queries.execution_detail(client=history, request_id="old-one")
    found_new = queries.execution_detail(client=history, request_id="new-one")
    assert found_old is not None and found_new is not None
    assert found_old["execution"]["trace_id"] == old["trace_id"]
    assert found_old["execution"]["error_type"] == "timeout"
    assert [s["span_id"] for s in found_new["trace"]] == [new["span_id"]]


def test_request_lookup_prunes_to_a_few_granules(history: HistoryClient) -> None:
    """EXPLAIN indexes: the id lookup reads one granule of the request id table, not all of them."""
    history.command(
        f"INSERT INTO {schema.table_name(history)} (Timestamp, TraceId, SpanId, SpanName, SpanAttributes) "
        "SELECT now64(9) - toIntervalMillisecond(number), hex(cityHash64(number)), hex(number), 'chat', "
        "map('llm_dispatch.request_id', concat('r-', toString(number)), 'llm_dispatch.status', 'ok') "
        "FROM numbers(120000)"
    )
    plan = history.query(
        f"EXPLAIN indexes = 1 SELECT TraceId FROM {schema.table_name(history, schema.REQUEST_IDS)} "
        "WHERE RequestId = 'r-77777'"
    )
    lines = [str(next(iter(r.values()))).strip() for r in plan]
    primary = lines[lines.index("PrimaryKey") :]
    selected, total = next(line for line in primary if line.startswith("Granules:")).split()[1].split("/")
    assert int(total) >= 14 and int(selected) <= 2, "\n".join(lines)
    assert queries.execution_detail(client=history, request_id="r-77777") is not None
