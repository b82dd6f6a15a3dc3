"""Publication waits for the database: dispatchers never see a configuration that is not committed."""

from __future__ import annotations

import pytest
import redis
from django.db import transaction
from django.test import Client

from pools import services
from pools.models import FabricGroup, Pool
from runtime.queue.keys import KeySpace
from tests.support.pools_admin import group_form
from tests.support.publication import published, registry

pytestmark = pytest.mark.django_db(transaction=True)


class Rollback(Exception):
    pass


def test_published_after_commit_not_while_the_transaction_is_open(
    group: FabricGroup, sredis: redis.Redis, keys: KeySpace
) -> None:
    with transaction.atomic():
        group.total_concurrency = 20
        results = services.group_save(group=group)
        assert published(sredis, keys, "g1") is None
        assert results == []
    config = published(sredis, keys, "g1")
    assert config is not None and config.total_concurrency == 20
    assert [r.ok for r in results] == [True]


def test_never_published_after_rollback(group: FabricGroup, sredis: redis.Redis, keys: KeySpace) -> None:
    with pytest.raises(Rollback), transaction.atomic():
        services.pool_save(pool=Pool(group=group, pool_id="doomed", sort_order=5))
        raise Rollback
    assert published(sredis, keys, "g1") is None
    assert registry(sredis, keys) == {}


def test_outside_a_transaction_publication_is_immediate(
    group: FabricGroup, sredis: redis.Redis, keys: KeySpace
) -> None:
    [result] = services.pool_pause(pool=Pool.objects.get(pool_id="backfill"))
    assert result.ok
    assert published(sredis, keys, "g1").pool("backfill").paused is True


def test_admin_publishes_what_it_committed(
    superuser_client: Client, sredis: redis.Redis, keys: KeySpace, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen_in_db_at_publish: list[int] = []
    real_publish = services.group_publish

    def publish_and_look(*, group: FabricGroup) -> services.PublishResult:
        # A second connection sees only committed rows (SQLite refuses to read a table another
        # connection is writing): what a dispatcher starting now would read.
        from django.db import connections

        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("SELECT COUNT(*) FROM pools_pool WHERE group_id = %s", [group.group_id])
                seen_in_db_at_publish.append(cursor.fetchone()[0])
        finally:
            other.close()
        return real_publish(group=group)

    monkeypatch.setattr(services, "group_publish", publish_and_look)
    rows = [{"pool_id": "fast", "quantum": 3}, {"pool_id": "slow", "sort_order": 1}]
    data = group_form({"group_id": "g2", "total_concurrency": 10}, rows)
    response = superuser_client.post("/admin/pools/fabricgroup/add/", data, follow=True)
    assert response.status_code == 200
    assert seen_in_db_at_publish == [2]
    config = published(sredis, keys, "g2")
    assert config is not None and [p.pool_id for p in config.pools] == ["fast", "slow"]
    assert "published to its dispatchers" in response.content.decode()
