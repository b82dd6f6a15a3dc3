"""Shared fixtures: a real Valkey server over TCP and per-test key isolation.

With ``VALKEY_URL`` set the suite uses that server (e.g. the machine's Redis 7); otherwise it starts
a private embedded Valkey for the session. Each test gets its own key prefix, so tests never see
each other's queues even on a shared server.

On pytest-xdist workers (``-n 2 --dist loadfile``, as the Redis/PostgreSQL pass of ``.ci/run`` runs)
each worker has its own embedded Valkey, Django test database and temporary directories, and runs a
module's tests in their order in the file, so a module-scoped stack starts once, as in one process.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from runtime.queue.keys import KeySpace
from runtime.valkey import embedded
from runtime.valkey.client import connect


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks ``stores`` the tests that talk to the suite's Valkey (``VALKEY_URL``) or the Django database.

    ``.ci/run`` runs the fast ``stores`` tests again against Redis 7.0 and PostgreSQL: the others (pure
    logic, private servers) would only repeat what the first pass proved.
    """
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "valkey_url" in fixtures or _uses_database(item, fixtures):
            item.add_marker(pytest.mark.stores)


def _uses_database(item: pytest.Item, fixtures: Iterable[str]) -> bool:
    marked = item.get_closest_marker("django_db") is not None
    return marked or bool({"db", "transactional_db"} & set(fixtures))


@pytest.fixture(scope="session")
def valkey_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("VALKEY_URL")
    if url:
        yield url
        return
    data_dir = tmp_path_factory.mktemp("valkey")
    server = embedded.start(data_dir)
    os.environ["DISPATCH_TEST_VALKEY_URL"] = server.url
    yield server.url
    embedded.stop(data_dir)


@pytest.fixture
def keys() -> KeySpace:
    return KeySpace(prefix=f"t{uuid.uuid4().hex[:10]}:")


@pytest.fixture
async def aredis(valkey_url: str) -> AsyncIterator[aioredis.Redis]:
    client = connect(valkey_url)
    yield client
    await client.aclose()


@pytest.fixture
def sredis(valkey_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(valkey_url)
    yield client
    client.close()


@pytest.fixture
def private_valkey(tmp_path: Path) -> Iterator[embedded.EmbeddedValkey]:
    """A Valkey server of this test's own, which the test may stop and restart."""
    server = embedded.start(tmp_path / "private-valkey")
    yield server
    embedded.stop(server.data_dir)
