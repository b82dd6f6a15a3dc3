"""Dashboard tests: Django pointed at the session's test Valkey, a per-test key prefix, a real layer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model

from pools import connections
from pools.models import Backend, FabricGroup, Pool
from runtime.queue.keys import KeySpace
from tests.support.browser import stack  # noqa: F401 - the browser tests' fixture
from tests.support.dashboard_live import point_dashboard_at
from tests.support.sentinel_cluster import sentinel_cluster  # noqa: F401 - a primary, a replica, three sentinels


@pytest.fixture(autouse=True)
def dashboard_on_test_valkey(settings, valkey_url: str, keys: KeySpace) -> Iterator[None]:
    """Publication, snapshot reads and the channels-redis layer all use the test server and prefix."""
    point_dashboard_at(settings, valkey_url, keys)
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    yield
    connections.valkey_url.cache_clear()


@pytest.fixture
def staff(db):
    return get_user_model().objects.create_user("staff", "staff@example.com", "pw", is_staff=True)


@pytest.fixture
def visitor(db):
    return get_user_model().objects.create_user("visitor", "visitor@example.com", "pw")


@pytest.fixture
def fabric(db) -> FabricGroup:
    """DRR group "g" (total 8): interactive (weight 4, min 2, max 4) and backfill (weight 1, max 4)."""
    backend = Backend.objects.create(backend_id="nowhere", base_url="http://127.0.0.1:9/v1", kind="openai",
                                     load_gating=False)  # fmt: skip
    group = FabricGroup.objects.create(
        group_id="g", name="Test group", policy="drr", total_concurrency=8, backend=backend
    )  # fmt: skip
    Pool.objects.create(
        group=group, pool_id="interactive", display_name="Interactive", quantum=4, min_concurrent=2,
        max_concurrent=4, max_burst_per_visit=2,
    )  # fmt: skip
    Pool.objects.create(group=group, pool_id="backfill", quantum=1, max_concurrent=4, sort_order=1)
    return group
