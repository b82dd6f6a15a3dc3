"""The backends panel and the rejections per pool: the page, the websocket view and /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import redis.asyncio as aioredis
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from dashboard import selectors
from pools import services
from pools.models import Backend, FabricGroup, Pool
from runtime.backends.breaker import BreakerState, encode_state
from runtime.backends.metrics import BackendLoad
from runtime.errors import QueueFull
from runtime.queue.admission import ADMIT_PUSH, admit_and_push
from runtime.queue.keys import KeySpace
from runtime.valkey.client import connect


@pytest.fixture
def staff_client(staff) -> Client:
    client = Client()
    client.force_login(staff)
    return client


@pytest.fixture
def gated(fabric: FabricGroup, sredis, keys: KeySpace) -> Backend:
    """The group on a vLLM backend with a shared load, two calls in flight and an open breaker;
    backfill bounded to 2 queued. Published."""
    backend = Backend.objects.create(
        backend_id="gpu", name="GPU box", base_url="http://gpu:8000/v1", max_in_flight=6
    )
    fabric.backend = backend
    fabric.save()
    Pool.objects.filter(pool_id="backfill").update(max_queued=2)
    assert services.group_publish(group=fabric).ok
    now = time.time()
    sredis.set(keys.backend_load("gpu"), BackendLoad("gpu", now, running=4, waiting=5, kv_usage=0.5,
                                                      in_flight_at_scrape=2).encode())  # fmt: skip
    sredis.zadd(keys.backend_inflight("gpu"), {"backfill:a": now + 30, "backfill:b": now + 30})
    sredis.set(keys.backend_breaker("gpu"), encode_state(BreakerState(mode="open", since=now, trips=1)))
    return backend


async def refuse_twice(valkey_url: str, keys: KeySpace) -> None:
    from runtime.policy.admission import AdmissionLimits

    client: aioredis.Redis = connect(valkey_url)
    try:
        script = client.register_script(ADMIT_PUSH)
        for i in range(4):
            with contextlib.suppress(QueueFull):
                await admit_and_push(script, keys, "backfill", b"r%d" % i, AdmissionLimits(max_queued=2))
    finally:
        await client.aclose()


def test_backends_and_rejections_in_the_view_page_and_metrics(
    staff_client: Client, gated: Backend, valkey_url: str, keys: KeySpace
) -> None:
    asyncio.run(refuse_twice(valkey_url, keys))
    configured = selectors.configured_pools(group_id="g")
    view = selectors.fabric_view(group_id="g", configured=configured)
    [backend] = view["backends"]
    # Five waiting at the scrape with max waiting 5: saturated, two of ours in flight, limit 2.
    assert (backend["running"], backend["waiting"], backend["in_flight"], backend["limit"]) == (4, 5, 2, 2)
    assert (backend["held"], backend["metrics"], backend["breaker_words"]) == (
        "backend_saturated", "fresh", "failing (calls held)")  # fmt: skip
    backfill = next(p for p in view["pools"] if p["pool_id"] == "backfill")
    assert backfill["rejected"] == {"max_queued": 2} and backfill["max_queued"] == 2

    page = staff_client.get("/fabric/g/").content.decode()
    assert 'data-backend="gpu"' in page and "GPU box" in page and "failing (calls held)" in page
    assert 'title="Read from vllm:kv_cache_usage_perc">50%' in page  # the KV gauge read
    assert "refused 2 (max_queued)" in page and " / max 2" in page

    text = staff_client.get("/metrics").content.decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("llm_dispatch_rejections_total", (("fabric_group", "g"), ("pool", "backfill"),
                                                       ("reason", "max_queued")))] == 2  # fmt: skip
    assert samples[("llm_dispatch_backend_waiting", (("backend", "gpu"),))] == 5
    assert samples[("llm_dispatch_backend_in_flight_limit", (("backend", "gpu"),))] == 2
    assert samples[("llm_dispatch_backend_breaker_open", (("backend", "gpu"), ("mode", "open")))] == 1
    assert samples[("llm_dispatch_backend_metrics_fresh", (("backend", "gpu"), ("metrics", "fresh")))] == 1


def test_stale_metrics_say_so(staff_client: Client, gated: Backend, sredis, keys: KeySpace) -> None:
    sredis.set(keys.backend_load("gpu"), BackendLoad("gpu", time.time() - 3, running=4, waiting=50).encode())
    page = staff_client.get("/fabric/g/").content.decode()
    assert "metrics stale" in page and "max in flight only" in page


def test_refused_metrics_say_why_on_the_page_and_in_metrics(
    staff_client: Client, gated: Backend, sredis, keys: KeySpace
) -> None:
    """Before: a NaN shared as null made the gate raise: the dashboard and /metrics answered 500."""
    sredis.set(
        keys.backend_load("gpu"), b'{"backend_id":"gpu","scraped_at":%f,"kv_usage":null}' % time.time()
    )
    response = staff_client.get("/fabric/g/")
    assert response.status_code == 200
    assert (
        "metrics refused: the shared load&#x27;s kv_usage is None, not a fraction"
        in response.content.decode()
    )
    response = staff_client.get("/metrics")
    assert response.status_code == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }
    assert samples[("llm_dispatch_backend_metrics_fresh", (("backend", "gpu"), ("metrics", "refused")))] == 0
    assert samples[("llm_dispatch_backend_in_flight_limit", (("backend", "gpu"),))] == 6  # max in flight


def test_a_429_hold_shows_in_the_backends_panel_with_the_time_left(
    staff_client: Client, gated: Backend, sredis, keys: KeySpace
) -> None:
    """Issue 24: while a backend's 429 Retry-After holds it, the panel says so and for how long."""
    sredis.delete(keys.backend_breaker("gpu"))
    sredis.set(keys.backend_hold("gpu"), "30", px=30_000)
    [backend] = selectors.fabric_view(group_id="g", configured=selectors.configured_pools(group_id="g"))[
        "backends"
    ]
    assert (backend["held"], backend["limit"]) == ("backend_retry_after", 0)
    assert backend["held_words"].startswith("the backend answered 429 with Retry-After; ")
    assert backend["held_words"].endswith("s left") and 29 < backend["hold_s"] <= 30
    page = staff_client.get("/fabric/g/").content.decode()
    assert 'title="the backend answered 429 with Retry-After; ' in page
    assert ">backend_retry_after</td>" in page
