"""What-if over real history (chDB): the arrivals read back, and ``manage.py whatif`` end to end."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from history.client import HistoryClient
from history.whatif import whatif_trace
from pools.models import FabricGroup, Pool
from pools.whatif import group_whatif
from runtime.telemetry import semconv
from tests.support.history_spans import execution_doc, store

pytestmark = pytest.mark.django_db


def doc(pool: str, at_ns: int, *, wait: float, run: float, cost: int = 1, group: str = "g", **kw):  # type: ignore[no-untyped-def]
    d = execution_doc(pool=pool, group=group, queue_wait=wait, execution=run, start_ns=at_ns, **kw)
    d["attributes"][semconv.COST_UNITS] = cost
    return d


def rejected(pool: str, at_ns: int):  # type: ignore[no-untyped-def]
    d = execution_doc(pool=pool, group="", status="rejected", start_ns=at_ns, output_tokens=None)
    del d["attributes"][semconv.GROUP_ID]
    d["attributes"][semconv.DROP_REASON] = "max_queued"
    return d


@pytest.fixture
def with_history(settings, history: HistoryClient, ch_url: str) -> HistoryClient:  # type: ignore[no-untyped-def]
    settings.CLICKHOUSE_URL = ch_url
    return history


def test_the_groups_arrivals_are_read_with_cost_tokens_waits_and_refusals(history: HistoryClient) -> None:
    now = time.time_ns()
    store(
        history,
        [
            doc("a", now - 50 * 10**9, wait=0.5, run=2.0, cost=3, tenant="key-1/alice", producer="web-1"),
            doc("b", now - 40 * 10**9, wait=0.0, run=1.0, output_tokens=7, input_tokens=30),
            doc("a", now - 30 * 10**9, wait=1.0, run=1.0, status="error", error_type="backend_error"),
            rejected("a", now - 20 * 10**9),
            doc("a", now - 10 * 10**9, wait=0.1, run=1.0, group="other"),  # another group's pool
            doc("a", now - 5 * 10**9, wait=0.1, run=1.0, status="dropped"),  # never ran: not read
            doc("a", now - 3600 * 10**9, wait=0.1, run=1.0),  # before the window
        ],
    )
    until = datetime.fromtimestamp(now / 1e9, tz=UTC)
    trace = whatif_trace(
        client=history, group="g", pool_ids=["a", "b"], since=until - timedelta(minutes=5), until=until
    )
    assert len(trace) == 4 and trace.pools == ["a", "b"]
    assert list(trace.cost) == [3, 1, 1, 0]  # a refusal at submit was never costed
    assert list(trace.refused) == [0, 0, 0, 1]
    assert list(trace.queue_wait_s)[:3] == [0.5, 0.0, 1.0]
    assert list(trace.execution_s)[:3] == [2.0, 1.0, 1.0] and not trace.ran(3)
    assert list(trace.input_tokens)[:2] == [10, 30] and list(trace.output_tokens)[:2] == [100, 7]
    # The tenant is the one the request was fair to (its key, or a sub-tenant), not the producer.
    assert [trace.tenants[t] for t in trace.tenant] == ["key-1/alice", "", "", ""]
    assert trace.enqueued_at[0] == pytest.approx((now - 50 * 10**9) / 1e9)
    # The replay stops at the last launch history holds (the error's, 30 s ago + 1 s of queue), or at
    # the last arrival after it (the refusal's, 20 s ago): not at `until`, where nothing was dispatched.
    assert trace.end == pytest.approx((now - 20 * 10**9) / 1e9)
    only_runs = whatif_trace(
        client=history, group="g", pool_ids=["b"], since=until - timedelta(minutes=5), until=until
    )
    assert only_runs.end == pytest.approx((now - 29 * 10**9) / 1e9)


def test_a_window_read_in_many_blocks_is_the_same_trace(history: HistoryClient, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import history.whatif as reader

    now = time.time_ns()
    backlogged_history(history, now)
    store(history, [rejected("backfill", now - 60 * 10**9 + 1)])
    until = datetime.fromtimestamp(now / 1e9, tz=UTC)

    def read() -> list[list[object]]:
        since = until - timedelta(minutes=5)
        t = whatif_trace(
            client=history, group="g", pool_ids=["interactive", "backfill"], since=since, until=until
        )
        columns = (t.enqueued_at, t.pool, t.cost, t.execution_s, t.queue_wait_s, t.refused, t.output_tokens)
        return [[t.start, t.end, t.pools, len(t)], *[[None if v != v else v for v in c] for c in columns]]

    whole = read()
    monkeypatch.setattr(reader, "BLOCK_ROWS", 7)  # 241 rows: 35 blocks
    assert read() == whole and whole[0][3] == 241 and whole[4].count(None) == 1  # the refusal never ran


def test_a_query_history_cannot_run_is_history_unavailable(history: HistoryClient) -> None:
    from history.client import HistoryUnavailable

    blocks = history.column_blocks("SELECT no_such_column FROM system.one")
    with pytest.raises(HistoryUnavailable, match="is unavailable"):
        next(blocks)
    assert [
        len(b["number"]) for b in history.column_blocks("SELECT number FROM numbers(10)", block_rows=4)
    ] == [4, 4, 2]


def backlogged_history(history: HistoryClient, now: int) -> None:
    """Two pools of equal traffic on 2 slots, a call a second each running 1.5 s: the queue grows."""
    docs = []
    for k in range(120):
        at = now - (130 - k) * 10**9
        docs.append(doc("interactive", at, wait=0.2 * k, run=1.5))
        docs.append(doc("backfill", at + 10**8, wait=0.2 * k, run=1.5))
    store(history, docs)


def make_group() -> FabricGroup:
    group = FabricGroup.objects.create(group_id="g", total_concurrency=2)
    Pool.objects.create(group=group, pool_id="interactive", quantum=1, max_concurrent=2, sort_order=0)
    Pool.objects.create(group=group, pool_id="backfill", quantum=1, max_concurrent=2, sort_order=1)
    return group


def test_whatif_command_prints_current_and_proposed_waits(with_history: HistoryClient) -> None:
    make_group()
    now = time.time_ns()
    backlogged_history(with_history, now)
    out = StringIO()
    call_command(
        "whatif", "--group", "g", "--minutes", "5", "--set", "interactive.weight=4", "--json",
        "--until", str(now / 1e9), stdout=out,
    )  # fmt: skip
    result = json.loads(out.getvalue())
    assert result["requests"] == 240
    interactive, backfill = result["pools"]["interactive"], result["pools"]["backfill"]
    assert interactive["proposed"]["wait"]["p50"] < interactive["current"]["wait"]["p50"]
    assert backfill["proposed"]["wait"]["p50"] > backfill["current"]["wait"]["p50"]
    assert interactive["recorded"]["wait"]["p50"] == pytest.approx(0.2 * 59.5, rel=1e-6)
    text = StringIO()
    call_command("whatif", "--group", "g", "--minutes", "5", "--set", "backfill.weight=2", stdout=text)
    assert "proposed" in text.getvalue() and "Service model" in text.getvalue()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("backfill.weight=0", "weight must be at least 1"),
        ("nosuch.weight=2", "has no pool 'nosuch'"),
        ("backfill.colour=red", "unknown pool field 'colour'"),
        ("backfill.weight", "expected NAME.FIELD=VALUE"),
        ("interactive.min_concurrent=3", "min concurrent (3) exceeds max concurrent (2)"),
    ],
)
def test_a_bad_set_is_a_clear_command_error(with_history: HistoryClient, change: str, message: str) -> None:
    make_group()
    with pytest.raises(CommandError, match="bad --set") as caught:
        call_command("whatif", "--group", "g", "--set", change)
    assert message in str(caught.value)


def test_an_unknown_group_is_a_command_error(with_history: HistoryClient) -> None:
    with pytest.raises(CommandError, match="no fabric group 'nope'"):
        call_command("whatif", "--group", "nope")


@pytest.fixture
def staff(client):  # type: ignore[no-untyped-def]
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("ops", password="pw"))
    return client


def test_the_admin_whatif_panel_shows_both_sides_per_pool(with_history: HistoryClient, staff) -> None:  # type: ignore[no-untyped-def]
    group = make_group()
    backlogged_history(with_history, time.time_ns())
    page = staff.get(f"/admin/pools/fabricgroup/{group.pk}/change/")
    assert b'id="whatif-open"' in page.content and b"/admin/pools/fabricgroup/g/whatif/" in page.content
    panel = staff.post(
        "/admin/pools/fabricgroup/g/whatif/", {"minutes": "5", "set": ["interactive.quantum=4"]}
    )
    html = panel.content.decode()
    assert panel.status_code == 200 and "Replayed 240 recorded requests" in html
    assert html.count('class="whatif-proposed"') == 2 and html.count("<svg") == 2
    pool = Pool.objects.get(pool_id="backfill")
    assert b'data-pool="backfill"' in staff.get(f"/admin/pools/pool/{pool.pk}/change/").content
    focused = staff.post(f"/admin/pools/pool/{pool.pk}/whatif/", {"set": ["backfill.weight=0"]})
    assert "This change cannot be replayed" in focused.content.decode()
    assert "weight must be at least 1" in focused.content.decode()


def test_a_window_over_the_replays_bound_is_refused_clearly(with_history: HistoryClient, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from runtime.whatif import trace

    make_group()
    backlogged_history(with_history, time.time_ns())
    monkeypatch.setattr(trace, "MAX_REQUESTS", 100)
    with pytest.raises(CommandError, match="the last 5 minutes hold too many requests"):
        call_command("whatif", "--group", "g", "--minutes", "5")


def test_a_fair_pools_tenants_are_replayed_with_their_keys_weights(with_history: HistoryClient) -> None:
    from ingress.selectors import tenant_weights
    from ingress.services import producer_key_create

    heavy = producer_key_create(name="heavy", pools=["chat"]).key
    heavy.tenant_weight = 3.0
    heavy.save()
    light = producer_key_create(name="light", pools=["chat"]).key
    tenants = [f"key-{heavy.pk}", f"key-{heavy.pk}:bob", f"key-{light.pk}", "key-999", "batch-7", "*"]
    assert tenant_weights(tenants=tenants) == {f"key-{heavy.pk}": 3.0, f"key-{heavy.pk}:bob": 3.0}
    group = FabricGroup.objects.create(group_id="g", total_concurrency=1)
    Pool.objects.create(group=group, pool_id="chat", max_concurrent=1, tenant_fairness="requests")
    now = time.time_ns()
    docs = []  # two tenants submitting alike, 2 a second, on one slot serving 1 a second
    for k in range(120):
        at = now - (130 * 10**9) + k * 5 * 10**8
        tenant = f"key-{heavy.pk}" if k % 2 else f"key-{light.pk}"
        docs.append(doc("chat", at, wait=0.0, run=1.0, tenant=tenant))
    store(with_history, docs)
    out = StringIO()
    call_command("whatif", "--group", "g", "--minutes", "5", "--json", "--until", str(now / 1e9), stdout=out)
    result = json.loads(out.getvalue())
    # Both tenants are backlogged all along: the heavy key's weight gets it 3 of every 4 launches (a
    # replay that ignored weights, or tenants, would give it about half).
    until = datetime.fromtimestamp(now / 1e9, tz=UTC)
    replayed = group_whatif(group=group, minutes=5, changes=[], until=until)
    trace = replayed.trace
    launched = [trace.tenants[trace.tenant[i]] for i in replayed.current.launch_order]
    share = launched.count(f"key-{heavy.pk}") / len(launched)
    assert 0.7 < share < 0.8 and result["pools"]["chat"]["current"]["launched"] == len(launched)
