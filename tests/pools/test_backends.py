"""Backends in the admin: bad values refused with clear messages, live load shown, edits published;
the migration that turns endpoint URLs into backend rows."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from pools import services
from pools.models import Backend, FabricGroup
from runtime.backends.breaker import BreakerState, encode_state
from runtime.backends.metrics import BackendLoad
from runtime.queue.keys import KeySpace
from tests.support.pools_admin import errors_of
from tests.support.publication import published

BACKEND_ADD = "/admin/pools/backend/add/"
GOOD = {
    "backend_id": "gpu-a",
    "name": "GPU A",
    "base_url": "http://gpu-a:8000/v1",
    "api_key_env": "",
    "kind": "vllm",
    "max_in_flight": 32,
    "timeout_s": 120,
    "connect_timeout_s": 5,
    "metrics_url": "",
    "load_gating": "on",
    "max_waiting": 5,
    "max_kv_cache_usage": 0.8,
    "metrics_max_age_s": 1,
    "metrics_timeout_s": 1,
    "metrics_max_bytes": 1048576,
    "breaker_failures": 5,
    "breaker_open_s": 10,
    "breaker_probes": 1,
    "_save": "Save",
}


def post(**changes: Any) -> dict[str, Any]:
    data = {**GOOD, **changes}
    return {k: v for k, v in data.items() if v is not None}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"backend_id": "GPU A"}, "is not a valid id"),
        ({"base_url": ""}, "This field is required"),
        ({"base_url": "gpu-a:8000"}, "Enter a valid http:// or https:// URL"),
        ({"base_url": "https://user:s3cret@gpu-a/v1"}, "This URL embeds credentials"),
        ({"metrics_url": "https://gpu-a/metrics?api_key=sk-1"}, "This URL embeds credentials"),
        ({"api_key_env": "sk-live-abc123"}, "name of an environment variable"),
        ({"max_in_flight": 0}, "Max in flight must be at least 1"),
        ({"max_kv_cache_usage": 1.5}, "more than 0 and at most 1 (got 1.5)"),
        ({"max_kv_cache_usage": 0}, "more than 0 and at most 1 (got 0)"),
        ({"max_waiting": -1}, "Ensure this value is greater than or equal to 0"),
        ({"metrics_max_age_s": 0}, "Metrics max age must be more than 0 seconds"),
        ({"timeout_s": 0}, "The call timeout must be more than 0 seconds"),
        ({"metrics_timeout_s": 0}, "The metrics timeout must be more than 0 seconds"),
        ({"metrics_max_bytes": 100}, "The metrics max size must be at least 1024 bytes"),
        ({"breaker_failures": 0}, "The breaker needs at least 1 failure to open"),
        ({"breaker_probes": 0}, "The breaker needs at least 1 probe to close again"),
        ({"breaker_open_s": -1}, "The breaker's open time must be more than 0 seconds"),
        ({"kind": "openai"}, "Load gating needs load metrics"),
        ({"kind": "triton"}, "Select a valid choice"),
    ],
)
def test_admin_refuses_bad_backend_values(superuser_client: Client, db, changes, message) -> None:
    response = superuser_client.post(BACKEND_ADD, post(**changes))
    assert response.status_code == 200
    assert message in errors_of(response)
    assert not Backend.objects.exists()


def test_credentials_are_never_echoed(superuser_client: Client, db) -> None:
    response = superuser_client.post(BACKEND_ADD, post(base_url="https://u:topsecret@h.example/v1"))
    assert "topsecret" not in errors_of(response)


def test_openai_kind_without_gating_is_accepted(superuser_client: Client, db) -> None:
    response = superuser_client.post(BACKEND_ADD, post(kind="openai", load_gating=None))
    assert response.status_code == 302, errors_of(response)
    assert Backend.objects.get(pk="gpu-a").kind == "openai"


@pytest.mark.django_db(transaction=True)  # publication happens at commit
def test_backend_edit_republishes_the_groups_using_it(
    superuser_client: Client, group: FabricGroup, sredis: redis.Redis, keys: KeySpace
) -> None:
    services.group_publish(group=group)
    data = post(backend_id="sim", base_url="http://127.0.0.1:8200/v1", max_in_flight=3)
    response = superuser_client.post("/admin/pools/backend/sim/change/", data)
    assert response.status_code == 302, errors_of(response)
    config = published(sredis, keys, "g1")
    assert config.backend("sim").max_in_flight == 3
    assert config.pool("backfill").endpoint_url == "http://127.0.0.1:8200/v1"


def test_a_backend_in_use_cannot_be_deleted(superuser_client: Client, group: FabricGroup) -> None:
    response = superuser_client.post("/admin/pools/backend/sim/delete/", {"post": "yes"})
    assert Backend.objects.filter(pk="sim").exists()
    assert "Cannot delete backend" in response.content.decode()


def test_admin_shows_live_load_next_to_the_settings(
    superuser_client: Client, backend: Backend, sredis: redis.Redis, keys: KeySpace
) -> None:
    now = time.time()
    load = BackendLoad("sim", now, running=4, waiting=2, kv_usage=0.37, in_flight_at_scrape=5)
    sredis.set(keys.backend_load("sim"), load.encode())
    sredis.zadd(keys.backend_inflight("sim"), {"p:r1": now + 30, "p:r2": now + 30, "p:gone": now - 1})
    sredis.set(keys.backend_breaker("sim"), encode_state(BreakerState(mode="open", since=now, trips=1)))
    page = superuser_client.get("/admin/pools/backend/").content.decode()
    assert "2/64 in flight from us; running 4, waiting 2, KV 37%" in page
    assert "breaker failing (calls held)" in page
    sredis.set(keys.backend_load("sim"), BackendLoad("sim", now - 5).encode())
    page = superuser_client.get("/admin/pools/backend/sim/change/").content.decode()
    assert re.search(r"metrics stale \(5\.\ds old\): max in flight only", page)


def test_admin_says_why_metrics_are_refused(
    superuser_client: Client, backend: Backend, sredis: redis.Redis, keys: KeySpace
) -> None:
    """Before: a NaN shared as null made the gate raise, and the backend list answered 500."""
    now = time.time()
    sredis.set(keys.backend_load("sim"), b'{"backend_id":"sim","scraped_at":%f,"kv_usage":null}' % now)
    response = superuser_client.get("/admin/pools/backend/")
    assert response.status_code == 200
    assert (
        "metrics refused: the shared load&#x27;s kv_usage is None, not a fraction"
        in response.content.decode()
    )
    refused = BackendLoad(
        "sim", now, error="vllm:num_requests_running is inf (not a finite number)", refused=True
    )
    sredis.set(keys.backend_load("sim"), refused.encode())
    page = superuser_client.get("/admin/pools/backend/sim/change/").content.decode()
    assert (
        "metrics refused: vllm:num_requests_running is inf (not a finite number): max in flight only" in page
    )
    old = BackendLoad("sim", now, running=1, kv_usage=0.5, kv_metric="vllm:gpu_cache_usage_perc")
    sredis.set(keys.backend_load("sim"), old.encode())
    page = superuser_client.get("/admin/pools/backend/").content.decode()
    assert "KV-cache usage read from vllm:gpu_cache_usage_perc (older server)" in page
    page = superuser_client.get("/admin/pools/backend/sim/change/").content.decode()
    assert "Time budget of one whole scrape" in page and "A larger metrics body is refused" in page
    # N probes run at once (the breaker's half_open_probes); the help text said "one at a time".
    assert "Calls let through at once, fleet-wide" in page and "one at a time" not in page


def test_live_load_says_when_valkey_is_down(superuser_client: Client, backend: Backend, valkey_down) -> None:
    assert "Valkey unreachable" in superuser_client.get("/admin/pools/backend/").content.decode()


@pytest.fixture
def back_to_the_latest_migrations() -> Iterator[None]:
    """A test that migrates back leaves the schema as it found it: later tests need every column."""
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("back_to_the_latest_migrations")
def test_migration_turns_endpoint_urls_into_backends() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([("pools", "0003_delivery")])
    apps = executor.loader.project_state([("pools", "0003_delivery")]).apps
    Group, Pool = apps.get_model("pools", "FabricGroup"), apps.get_model("pools", "Pool")
    g1 = Group.objects.create(group_id="g1", default_endpoint_url="http://gpu:8000/v1", api_key_env="KEY_A")
    g2 = Group.objects.create(group_id="g2", default_endpoint_url="http://gpu:8000/v1")
    Pool.objects.create(group=g1, pool_id="a")
    Pool.objects.create(group=g1, pool_id="b", endpoint_url="https://api.example.com/v1")
    Pool.objects.create(group=g2, pool_id="c")
    executor = MigrationExecutor(connection)
    executor.migrate([("pools", "0004_backends")])
    apps = executor.loader.project_state([("pools", "0004_backends")]).apps
    Backend_, Group, Pool = (apps.get_model("pools", m) for m in ("Backend", "FabricGroup", "Pool"))
    backends = {
        b.backend_id: (b.base_url, b.api_key_env, b.kind, b.load_gating) for b in Backend_.objects.all()
    }
    # One row per (URL, key variable): the same URL with another key is another backend.
    assert backends == {
        "gpu-8000": ("http://gpu:8000/v1", "KEY_A", "openai", False),
        "gpu-8000-2": ("http://gpu:8000/v1", "", "openai", False),
        "api.example.com": ("https://api.example.com/v1", "KEY_A", "openai", False),
    }
    assert dict(Group.objects.values_list("group_id", "backend_id")) == {"g1": "gpu-8000", "g2": "gpu-8000-2"}
    assert dict(Pool.objects.values_list("pool_id", "backend_id")) == {
        "a": None,
        "b": "api.example.com",
        "c": None,
    }
