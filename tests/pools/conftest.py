"""Pool tests publish to the session's test Valkey under their own key prefix."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from pools import connections
from pools.models import Backend, FabricGroup, Pool
from runtime.queue.keys import KeySpace
from runtime.valkey import embedded


@pytest.fixture(autouse=True)
def published_to_test_valkey(settings, valkey_url: str, keys: KeySpace) -> Iterator[None]:
    """Points pools.connections (and so every publish) at the test server and key prefix."""
    connections.valkey_url.cache_clear()
    settings.VALKEY_URL = valkey_url
    settings.DISPATCH_KEY_PREFIX = keys.prefix
    yield
    connections.valkey_url.cache_clear()


@pytest.fixture(autouse=True)
def fast_password_hasher(settings) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def valkey_down(settings) -> Iterator[str]:
    """VALKEY_URL pointing at a port nothing listens on."""
    url = f"redis://127.0.0.1:{embedded.free_port()}/0"
    connections.valkey_url.cache_clear()
    settings.VALKEY_URL = url
    yield url
    connections.valkey_url.cache_clear()


@pytest.fixture
def superuser_client(db) -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def backend(db) -> Backend:
    """The simulator's address as backend ``sim`` (vLLM metrics, gating on)."""
    return Backend.objects.create(backend_id="sim", name="Simulator", base_url="http://127.0.0.1:8100/v1")


@pytest.fixture
def group(backend: Backend) -> FabricGroup:
    """A DRR group (total 16) on backend ``sim`` with interactive (min 4) and backfill, not published."""
    group = FabricGroup.objects.create(
        group_id="g1",
        name="G1",
        policy="drr",
        total_concurrency=16,
        backend=backend,
    )
    Pool.objects.create(
        group=group,
        pool_id="interactive",
        quantum=4,
        min_concurrent=4,
        max_concurrent=12,
        max_burst_per_visit=4,
    )
    Pool.objects.create(group=group, pool_id="backfill", quantum=1, max_concurrent=8, sort_order=1)
    return group
