"""History views: staff only, with data, empty, and with ClickHouse down (real chDB engine)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from history.client import HistoryClient, close_all
from tests.support.history_spans import execution_doc, store

pytestmark = pytest.mark.django_db

SECRET = "hunter2-pw"


@pytest.fixture
def staff_client(client: Client) -> Client:
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    client.force_login(user)
    return client


@pytest.fixture
def with_history(settings, history: HistoryClient, ch_url: str) -> HistoryClient:  # type: ignore[no-untyped-def]
    settings.CLICKHOUSE_URL = ch_url
    return history


@pytest.fixture
def history_down(settings):  # type: ignore[no-untyped-def]
    close_all()
    settings.CLICKHOUSE_URL = "http://127.0.0.1:1"
    yield
    close_all()


@pytest.fixture
def no_valkey(settings, monkeypatch):  # type: ignore[no-untyped-def]
    """The stream status box reads Valkey; point it at a closed port so tests stay self-contained."""
    from pools import connections

    monkeypatch.setattr(connections, "valkey_url", lambda: "redis://127.0.0.1:1/0")


URLS = ["/history/", "/history/pools/", "/history/request/abc/"]


@pytest.mark.parametrize("url", URLS)
def test_anonymous_and_non_staff_are_refused(client: Client, url: str) -> None:
    assert client.get(url).status_code == 302
    client.force_login(User.objects.create_user("someone", password="pw"))
    response = client.get(url)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_views_with_data(staff_client: Client, with_history: HistoryClient, no_valkey: None) -> None:
    doc = execution_doc(request_id="req-view", pool="batch", status="error", error_type="timeout")
    doc["attributes"]["llm_dispatch.backend_url"] = f"http://user:{SECRET}@backend.local:8000/v1"
    store(with_history, [doc, execution_doc(pool="interactive")])

    recent = staff_client.get("/history/")
    body = recent.content.decode()
    assert recent.status_code == 200 and "req-view" in body and "timeout" in body and "interactive" in body

    only = staff_client.get("/history/", {"pool": "interactive"}).content.decode()
    assert "req-view" not in only

    detail = staff_client.get("/history/request/req-view/")
    text = detail.content.decode()
    assert detail.status_code == 200
    assert doc["trace_id"] in text and "backend.local:8000" in text and SECRET not in text
    assert "timeout happened" in text

    pools = staff_client.get("/history/pools/", {"window": "24h"})
    text = pools.content.decode()
    assert pools.status_code == 200 and "<svg" in text and "batch" in text and "Queue wait" in text
    assert "100.0%" in text and "0.0%" in text  # batch: 1 error of 1; interactive: none


def test_views_with_no_data(staff_client: Client, with_history: HistoryClient, no_valkey: None) -> None:
    assert "No executions recorded yet" in staff_client.get("/history/").content.decode()
    assert "No executions match" in staff_client.get("/history/", {"pool": "x"}).content.decode()
    assert "No executions in the last 1h" in staff_client.get("/history/pools/").content.decode()
    missing = staff_client.get("/history/request/none/")
    assert missing.status_code == 404 and "No execution with this request id" in missing.content.decode()


@pytest.mark.parametrize("url", URLS)
def test_views_with_clickhouse_down(
    staff_client: Client, history_down: None, no_valkey: None, url: str
) -> None:
    response = staff_client.get(url)
    assert response.status_code == 503
    text = response.content.decode()
    assert "History is unavailable" in text and "Traceback" not in text


def test_bad_filter_values_do_not_crash(
    staff_client: Client, with_history: HistoryClient, no_valkey: None
) -> None:
    response = staff_client.get("/history/", {"since": "not a date", "page": "-3", "status": "weird"})
    assert response.status_code == 200
    assert staff_client.get("/history/pools/", {"window": "99y"}).status_code == 200


def test_admin_links_to_history(staff_client: Client) -> None:
    User.objects.filter(username="ops").update(is_superuser=True)
    text = staff_client.get("/admin/").content.decode()
    assert 'href="/history/"' in text and 'href="/history/pools/"' in text


def test_recent_reads_the_last_hour_by_default_and_widens_on_demand(
    staff_client: Client, with_history: HistoryClient, no_valkey: None
) -> None:
    store(
        with_history,
        [
            execution_doc(request_id="fresh-one", pool="fresh"),
            execution_doc(request_id="day-old", ago_s=86400 + 600),
        ],
    )
    default = staff_client.get("/history/").content.decode()
    assert "fresh-one" in default and "day-old" not in default and "last 1h" in default
    widened = staff_client.get("/history/", {"window": "7d"}).content.decode()
    assert widened.index("fresh-one") < widened.index("day-old")  # newest first


def test_empty_window_says_older_history_exists(
    staff_client: Client, with_history: HistoryClient, no_valkey: None
) -> None:
    store(with_history, [execution_doc(request_id="day-old", ago_s=86400 + 600)])
    text = staff_client.get("/history/").content.decode()
    assert "No executions in this window" in text and "choose a longer window" in text


def test_detail_page_finds_old_and_new_requests(
    staff_client: Client, with_history: HistoryClient, no_valkey: None
) -> None:
    old = execution_doc(request_id="req-old", ago_s=6 * 86400)
    new = execution_doc(request_id="req-new", ago_s=1)
    store(with_history, [old, new])
    for doc in (old, new):
        response = staff_client.get(f"/history/request/{doc['attributes']['llm_dispatch.request_id']}/")
        assert response.status_code == 200 and doc["trace_id"] in response.content.decode()


def test_pools_page_states_approximation_and_offers_exact_for_short_windows(
    staff_client: Client, with_history: HistoryClient, no_valkey: None
) -> None:
    store(with_history, [execution_doc(pool="a", queue_wait=w) for w in (1.0, 2.0, 3.0, 4.0)])
    approx = staff_client.get("/history/pools/").content.decode()
    assert "Percentiles are approximate" in approx and "within 2%" in approx
    exact = staff_client.get("/history/pools/", {"exact": "on"}).content.decode()
    assert "Percentiles are exact" in exact and "2.50 s" in exact  # p50 of 1..4 by interpolation
    refused = staff_client.get("/history/pools/", {"exact": "on", "window": "7d"}).content.decode()
    assert "Exact percentiles are offered for windows up to 1h" in refused
    assert "Percentiles are approximate" in refused and "last 7d" in refused


def test_pools_page_shows_tenants_only_when_spans_carry_them(
    staff_client: Client, with_history: HistoryClient, no_valkey: None
) -> None:
    store(with_history, [execution_doc(pool="a", queue_wait=w) for w in (1.0, 2.0)])
    assert "<h3>Tenants</h3>" not in staff_client.get("/history/pools/").content.decode()
    store(
        with_history,
        [
            *(execution_doc(pool="a", tenant="acme", queue_wait=w, input_tokens=7) for w in (1.0, 2.0, 3.0)),
            execution_doc(pool="a", tenant="beta-corp", queue_wait=0.25, input_tokens=5, output_tokens=1234),
        ],
    )
    text = staff_client.get("/history/pools/").content.decode()
    table = text[text.index("<h3>Tenants</h3>") :]
    table = table[: table.index("</table>")]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in table.split("<tr>")]
    assert [r for r in rows if r] == [  # busiest first; p50, p99 of 1, 2, 3 s by interpolation
        ["a", "acme", "3", "21", "300", "2.00 s", "2.98 s"],
        ["a", "beta-corp", "1", "5", "1,234", "250.0 ms", "250.0 ms"],
    ]
