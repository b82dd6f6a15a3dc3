"""Dashboard page, pause/resume and /metrics through Django's test client, on the test Valkey."""

from __future__ import annotations

import time

import orjson
import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from pools.models import Pool
from runtime.wire.groupconfig import GroupConfig
from tests.support.pools_admin import dead_letter
from tests.support.snapshots import pool, snap


@pytest.fixture
def staff_client(staff) -> Client:
    client = Client()
    client.force_login(staff)
    return client


def store_snapshot(sredis, keys, *, age: float = 0.0) -> dict:
    pools = [
        pool("interactive", display_name="Interactive", weight=4, min_concurrent=2, max_concurrent=4,
             queue_depth=3, in_flight=2, in_flight_local=2, deficit=5, skips={"pool_cap": 4},
             oldest_pending_age_s=2.5, head_cost=3),
        pool("backfill", queue_depth=0, in_flight=1, in_flight_local=1, deficit=0, paused=True),
    ]  # fmt: skip
    data = snap("d1", time.time() - age, pools, group_in_flight=3, in_flight=3, completed=42,
                dropped={"expired": 2}, failed={"backend_timeout": 1},
                breakers={"http://gpu-1:8000/v1": {"mode": "open", "trips": 2},
                          "http://gpu-2:8000/v1": {"mode": "closed", "trips": 0}},
                active=[{"request_id": "req-123", "pool_id": "interactive", "producer_id": "prod-9",
                         "model": "sim-model", "stage": "executing", "age_s": 1.2}])  # fmt: skip
    sredis.set(keys.snapshot("g", "d1"), orjson.dumps(data), px=10_000)
    return data


def test_anonymous_users_are_sent_to_the_login_page(client, fabric) -> None:
    for url in ("/", "/fabric/g/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/?next=")


def test_non_staff_users_are_sent_to_the_login_page(client, fabric, visitor) -> None:
    client.force_login(visitor)
    assert client.get("/fabric/g/").status_code == 302


def test_one_group_goes_straight_to_its_dashboard(staff_client, fabric) -> None:
    response = staff_client.get("/")
    assert response.status_code == 302 and response["Location"] == "/fabric/g/"


def test_several_groups_get_a_picker(staff_client, fabric) -> None:
    fabric.pk = None
    fabric.group_id, fabric.name = "other", "Other group"
    fabric.save()
    page = staff_client.get("/").content.decode()
    assert 'href="/fabric/g/"' in page and 'href="/fabric/other/"' in page


def test_page_without_dispatcher_says_so_and_shows_live_queue_lengths(
    staff_client, fabric, sredis, keys
) -> None:
    sredis.rpush(keys.requests("backfill"), b"a", b"b")
    page = staff_client.get("/fabric/g/").content.decode()
    assert "No dispatcher is running for this group" in page
    assert "rundispatcher --group g" in page
    assert 'data-pool="interactive"' in page and 'data-pool="backfill"' in page
    assert '<span class="fig" data-f="queue_depth">2</span>' in page
    assert 'data-ws="/ws/fabric/g/"' in page and "dashboard/fabric.js" in page


def test_page_first_paint_from_the_stored_snapshot(staff_client, fabric, sredis, keys) -> None:
    store_snapshot(sredis, keys)
    page = staff_client.get("/fabric/g/").content.decode()
    assert "No dispatcher is running" not in page
    assert '<span class="fig" data-f="queue_depth">3</span>' in page
    assert '<span data-f="in_flight">2</span> / 4' in page
    assert 'title="pool_cap: ' in page and "pool at its max <b>4</b>" in page and "2.5 s" in page
    assert "req-123" in page and "prod-9" in page
    assert "gw-1" in page and "<code>d1</code>" in page
    assert "Expired in the queue" in page
    interactive = Pool.objects.get(pool_id="interactive")
    assert f'href="/admin/pools/pool/{interactive.pk}/change/"' in page
    assert "/history/?pool=interactive" in page
    assert 'action="/fabric/g/pools/backfill/resume/"' in page  # paused in the snapshot
    assert 'action="/fabric/g/pools/interactive/pause/"' in page
    # Breaker state per backend, in plain words ("closed" in green reads as "down").
    assert 'title="http://gpu-1:8000/v1 — ' in page and ">failing (calls held) · opened 2 times<" in page
    assert 'title="http://gpu-2:8000/v1 — ' in page and ">healthy</span>" in page
    assert ">closed<" not in page and ">open ·" not in page


def test_stale_feed_is_flagged(staff_client, fabric, sredis, keys) -> None:
    store_snapshot(sredis, keys, age=8)
    page = staff_client.get("/fabric/g/").content.decode()
    assert "The live feed is stale" in page


@pytest.mark.django_db(transaction=True)  # the service publishes at commit
def test_pause_and_resume_go_through_the_pool_service_and_publish(staff_client, fabric, sredis, keys) -> None:
    response = staff_client.post("/fabric/g/pools/backfill/pause/")
    assert response.status_code == 302 and response["Location"] == "/fabric/g/"
    assert Pool.objects.get(pool_id="backfill").paused is True
    published = GroupConfig.decode(sredis.get(keys.group_config("g")))
    assert published.pool("backfill").paused is True
    response = staff_client.post("/fabric/g/pools/backfill/resume/", HTTP_ACCEPT="application/json")
    resumed = GroupConfig.decode(sredis.get(keys.group_config("g")))
    assert resumed.pool("backfill").paused is False
    # The version it published: the page holds the row until a snapshot of that version arrives.
    assert response.json() == {
        "pool_id": "backfill",
        "paused": False,
        "published": True,
        "errors": [],
        "version": resumed.version,
    }


def test_pause_needs_post_csrf_staff_and_the_right_group(staff_client, fabric, client, staff) -> None:
    assert staff_client.get("/fabric/g/pools/backfill/pause/").status_code == 405
    assert client.post("/fabric/g/pools/backfill/pause/").status_code == 302  # anonymous: to login
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(staff)
    assert strict.post("/fabric/g/pools/backfill/pause/").status_code == 403
    assert staff_client.post("/fabric/other/pools/backfill/pause/").status_code == 404
    assert staff_client.post("/fabric/g/pools/nope/pause/").status_code == 404
    assert Pool.objects.get(pool_id="backfill").paused is False


def test_metrics_parse_and_queue_depth_is_the_live_llen(client, fabric, sredis, keys) -> None:
    store_snapshot(sredis, keys)  # says interactive has 3 queued ...
    sredis.rpush(keys.requests("interactive"), *[b"x"] * 7)  # ... but the list really holds 7
    sredis.hset(
        keys.counters("g"),
        mapping={
            "completed": 40, "dropped:expired": 2, "failed:backend_timeout": 1,
            "unpersisted:waitaof_unsupported": 3,
        },
    )  # fmt: skip
    response = client.get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.content.decode())}

    def value(family: str, **labels: str) -> float:
        found = [
            s.value for s in families[family].samples if all(s.labels.get(k) == v for k, v in labels.items())
        ]
        assert len(found) == 1, (family, labels, families[family].samples)
        return found[0]

    assert value("llm_dispatch_queue_depth", fabric_group="g", pool="interactive") == sredis.llen(
        keys.requests("interactive")
    ) == 7  # fmt: skip
    assert value("llm_dispatch_queue_depth", fabric_group="g", pool="backfill") == 0
    assert value("llm_dispatch_in_flight", fabric_group="g", pool="interactive") == 2
    assert value("llm_dispatch_dispatchers_running", fabric_group="g") == 1
    assert value("llm_dispatch_deficit", fabric_group="g", pool="interactive", dispatcher="d1") == 5
    assert value("llm_dispatch_skips", fabric_group="g", pool="interactive", reason="pool_cap") == 4
    assert value("llm_dispatch_completions", fabric_group="g") == 40
    assert value("llm_dispatch_drops", fabric_group="g", reason="expired") == 2
    assert value("llm_dispatch_failures", fabric_group="g", error_type="backend_timeout") == 1
    assert value("llm_dispatch_unpersisted_pushes", fabric_group="g", outcome="waitaof_unsupported") == 3
    assert value("llm_dispatch_pool_paused", fabric_group="g", pool="backfill") == 1
    assert value("llm_dispatch_valkey_up") == 1
    assert value("llm_dispatch_breaker_open", backend="http://gpu-1:8000/v1", dispatcher="d1") == 1
    assert value("llm_dispatch_breaker_open", backend="http://gpu-2:8000/v1", dispatcher="d1") == 0


def test_metrics_without_valkey_still_answer(client, fabric, settings) -> None:
    from pools import connections
    from runtime.valkey.embedded import free_port

    connections.valkey_url.cache_clear()
    settings.VALKEY_URL = f"redis://127.0.0.1:{free_port()}/0"
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").content.decode())}
    assert families["llm_dispatch_valkey_up"].samples[0].value == 0


def test_reasons_are_explained_in_a_legend_and_on_hover(staff_client, fabric, sredis, keys) -> None:
    store_snapshot(sredis, keys)
    page = staff_client.get("/fabric/g/").content.decode()
    assert 'id="legend-drop"' in page and 'id="legend-skip"' in page
    for reason in ("expired", "producer_gone", "malformed"):  # every drop reason, even at zero
        assert f'<dt data-reason="{reason}">' in page
    assert '<dt data-reason="pool_cap">pool at its max <code>pool_cap</code></dt>' in page
    assert 'title="expired: The request&#x27;s deadline passed' in page  # the drop counter row


def test_every_page_has_the_same_navigation_favicon_and_logout(fabric, django_user_model) -> None:
    staff_client = Client()
    staff_client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", "pw"))
    pages = ["/fabric/g/", "/admin/", "/admin/pools/pool/", "/admin/pools/fabricgroup/g/change/", "/history/"]
    for url in pages:
        response = staff_client.get(url)
        page = response.content.decode()
        assert '<header class="site-nav">' in page, url
        for label, href in (("Dashboard", "/"), ("History", "/history/"), ("Admin", "/admin/")):
            assert f'<a href="{href}"' in page and f">{label}</a>" in page, (url, label)
        assert 'action="/admin/logout/"' in page and ">Log out</button>" in page, url
        assert 'rel="icon" type="image/svg+xml" href="/static/dashboard/favicon.svg"' in page, url


def test_dead_letters_per_pool_with_their_oldest_and_a_link_to_act(
    staff_client, fabric, sredis, keys
) -> None:
    sredis.rpush(
        keys.dead_letters("backfill"), dead_letter("r-1", dead_at=time.time() - 90), dead_letter("r-2")
    )
    page = staff_client.get("/fabric/g/").content.decode()
    assert '<span class="value" data-v="dead_letters_total">2</span>' in page
    row = page[page.index('<tbody id="dead-letters">') :]
    row = row[: row.index("</tbody>")]
    assert "backfill" in row and '<td class="num">2</td>' in row and "interactive" not in row
    oldest = int(row.split('<td class="num">')[2].split(" s<")[0])
    assert 89 <= oldest <= 120
    pk = fabric.pools.get(pool_id="backfill").pk
    assert f'href="/admin/pools/pool/{pk}/dead-letters/"' in row


def test_durable_pushes_answered_without_persistence_are_listed_with_the_counters(
    staff_client, fabric, sredis, keys
) -> None:
    sredis.hset(keys.counters("g"), "unpersisted:waitaof_unsupported", 5)
    html = staff_client.get("/fabric/g/").content.decode()
    assert "Not persisted: waitaof_unsupported" in html and "has no WAITAOF" in html
