"""Admin edits reach Valkey: the published config, the pool registry, pause/resume, and Valkey outages."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.test import Client

from pools import selectors, services
from pools.models import Backend, FabricGroup, Pool
from runtime.queue.keys import KeySpace
from tests.support.pools_admin import changelist_form, existing_rows, group_form
from tests.support.publication import published, registry

pytestmark = pytest.mark.django_db(transaction=True)  # publication happens at commit


def shown(response: Any) -> list[tuple[str, str]]:
    return [(m.level_tag, m.message) for m in get_messages(response.wsgi_request)]


def test_group_publish_writes_config_registry_and_notifies(
    group: FabricGroup, sredis: redis.Redis, keys: KeySpace
) -> None:
    pubsub = sredis.pubsub()
    pubsub.subscribe(keys.config_channel("g1"))
    pubsub.get_message(timeout=1)  # subscribe confirmation
    result = services.group_publish(group=group)
    assert result.ok and result.pools == 2
    config = published(sredis, keys, "g1")
    assert config == selectors.group_config(group=group, version=result.version)
    assert [p.pool_id for p in config.pools] == ["interactive", "backfill"]  # ring order
    assert registry(sredis, keys) == {"interactive": "g1", "backfill": "g1"}
    message = pubsub.get_message(timeout=2)
    assert message and message["type"] == "message"
    pubsub.close()


def test_version_increases_on_every_publish(group: FabricGroup) -> None:
    versions = [services.group_publish(group=group).version for _ in range(5)]
    assert versions == sorted(set(versions))


def test_group_add_in_admin_publishes(
    superuser_client: Client, backend: Backend, sredis: redis.Redis, keys: KeySpace
) -> None:
    backend.api_key_env = "OPENAI_API_KEY"
    backend.save()
    rows = [{"pool_id": "fast", "quantum": 3, "min_concurrent": 2}, {"pool_id": "slow", "sort_order": 1}]
    data = group_form({"group_id": "g2", "total_concurrency": 10, "backend": "sim"}, rows)
    response = superuser_client.post("/admin/pools/fabricgroup/add/", data, follow=True)
    assert response.status_code == 200
    config = published(sredis, keys, "g2")
    # The seed's fields are resolved from the group's backend, for tools that read them.
    assert config is not None and config.total_concurrency == 10 and config.api_key_env == "OPENAI_API_KEY"
    assert config.default_endpoint_url == "http://127.0.0.1:8100/v1"
    assert [b.backend_id for b in config.backends] == ["sim"] and config.backend_id == "sim"
    assert [(p.pool_id, p.quantum, p.min_concurrent) for p in config.pools] == [
        ("fast", 3, 2),
        ("slow", 1, 0),
    ]
    assert (
        "info",
        f"Configuration of group “g2” published to its dispatchers (version {config.version}).",
    ) in shown(response)


def test_list_editable_weight_edit_publishes(
    superuser_client: Client, group: FabricGroup, sredis: redis.Redis, keys: KeySpace
) -> None:
    pools = list(Pool.objects.order_by("pk"))
    data = changelist_form(pools, backfill={"quantum": 3, "max_burst_per_visit": 2})
    response = superuser_client.post("/admin/pools/pool/", data)
    assert response.status_code == 302
    backfill = published(sredis, keys, "g1").pool("backfill")
    assert (backfill.quantum, backfill.max_burst_per_visit) == (3, 2)


def test_inline_edit_and_delete_publish(
    superuser_client: Client, group: FabricGroup, sredis: redis.Redis, keys: KeySpace
) -> None:
    services.group_publish(group=group)
    Backend.objects.create(backend_id="gpu-1", base_url="http://gpu-1:8000/v1", kind="sglang")
    rows = existing_rows(group, backfill={"DELETE": True}, interactive={"backend": "gpu-1"})
    rows.append({"pool_id": "batch", "sort_order": 5})
    data = group_form({"total_concurrency": 20, "backend": "sim"}, rows, initial=2)
    response = superuser_client.post(f"/admin/pools/fabricgroup/{group.pk}/change/", data)
    assert response.status_code == 302
    config = published(sredis, keys, "g1")
    assert config.total_concurrency == 20
    assert [p.pool_id for p in config.pools] == ["interactive", "batch"]
    assert config.endpoint_for("interactive") == "http://gpu-1:8000/v1"
    assert config.pool("interactive").endpoint_url == "http://gpu-1:8000/v1"
    assert config.backend_for("interactive").kind == "sglang"
    assert config.pool("batch").endpoint_url == "http://127.0.0.1:8100/v1"
    assert registry(sredis, keys) == {"interactive": "g1", "batch": "g1"}


def test_pause_and_resume_actions_publish_and_keep_the_queue(
    superuser_client: Client, group: FabricGroup, sredis: redis.Redis, keys: KeySpace
) -> None:
    queue = keys.requests("backfill")
    sredis.rpush(queue, b"req-1", b"req-2")
    backfill = Pool.objects.get(pool_id="backfill")
    action = {"action": "pause_pools", "_selected_action": [backfill.pk]}
    response = superuser_client.post("/admin/pools/pool/", action, follow=True)
    assert Pool.objects.get(pk=backfill.pk).paused is True
    assert published(sredis, keys, "g1").pool("backfill").paused is True
    assert published(sredis, keys, "g1").pool("interactive").paused is False
    assert "backfill" in registry(sredis, keys)  # paused pools still accept submits
    assert ("success", "Paused 1 pool(s); their queued work stays queued.") in shown(response)
    page = response.content.decode()
    assert "❚❚ PAUSED" in page
    assert sredis.lrange(queue, 0, -1) == [b"req-1", b"req-2"]

    superuser_client.post("/admin/pools/pool/", {**action, "action": "resume_pools"})
    assert published(sredis, keys, "g1").pool("backfill").paused is False
    assert sredis.lrange(queue, 0, -1) == [b"req-1", b"req-2"]


def test_changelist_shows_queue_depth(superuser_client: Client, group: FabricGroup, sredis, keys) -> None:
    sredis.rpush(keys.requests("interactive"), b"a", b"b", b"c")
    response = superuser_client.get("/admin/pools/pool/")
    assert response.status_code == 200
    assert '<td class="field-queued">3</td>' in response.content.decode()


def test_disabled_pool_leaves_the_registry(
    superuser_client: Client, group: FabricGroup, sredis: redis.Redis, keys: KeySpace
) -> None:
    services.group_publish(group=group)
    assert "backfill" in registry(sredis, keys)
    rows = existing_rows(group, backfill={"enabled": False})
    response = superuser_client.post(
        f"/admin/pools/fabricgroup/{group.pk}/change/", group_form({}, rows, initial=2)
    )
    assert response.status_code == 302
    assert registry(sredis, keys) == {"interactive": "g1"}
    config = published(sredis, keys, "g1")
    assert config.pool("backfill").enabled is False
    assert [p.pool_id for p in config.enabled_pools] == ["interactive"]


def test_pool_admin_delete_and_group_delete_unpublish(
    superuser_client: Client, group: FabricGroup, sredis: redis.Redis, keys: KeySpace
) -> None:
    services.group_publish(group=group)
    backfill = Pool.objects.get(pool_id="backfill")
    superuser_client.post(f"/admin/pools/pool/{backfill.pk}/delete/", {"post": "yes"})
    assert registry(sredis, keys) == {"interactive": "g1"}
    superuser_client.post(f"/admin/pools/fabricgroup/{group.pk}/delete/", {"post": "yes"})
    assert registry(sredis, keys) == {}
    assert published(sredis, keys, "g1") is None


def test_pool_moved_to_another_group_republishes_both(group: FabricGroup, sredis, keys) -> None:
    other = FabricGroup.objects.create(group_id="g2", total_concurrency=4)
    pool = Pool.objects.get(pool_id="backfill")
    pool.group = other
    results = services.pool_save(pool=pool)
    assert [r.group_id for r in results] == ["g1", "g2"] and all(r.ok for r in results)
    assert registry(sredis, keys) == {"interactive": "g1", "backfill": "g2"}


def test_valkey_down_save_succeeds_with_a_warning(
    superuser_client: Client, group: FabricGroup, valkey_down
) -> None:
    pools = list(Pool.objects.order_by("pk"))
    response = superuser_client.post(
        "/admin/pools/pool/", changelist_form(pools, backfill={"quantum": 5}), follow=True
    )
    assert response.status_code == 200
    assert Pool.objects.get(pool_id="backfill").quantum == 5
    [(_, text)] = [m for m in shown(response) if m[0] == "warning"]
    assert text.startswith("Saved, but the configuration of group “g1” was not published: Valkey unreachable")
    assert "manage.py pools_publish" in text
    assert '<td class="field-queued">?</td>' in response.content.decode()


def test_valkey_down_group_add_and_actions(superuser_client: Client, group: FabricGroup, valkey_down) -> None:
    data = group_form({"group_id": "g2"}, [{"pool_id": "p1"}])
    response = superuser_client.post("/admin/pools/fabricgroup/add/", data, follow=True)
    assert FabricGroup.objects.filter(group_id="g2").exists()
    assert any(level == "warning" for level, _ in shown(response))
    pool = Pool.objects.get(pool_id="p1")
    response = superuser_client.post(
        "/admin/pools/pool/", {"action": "pause_pools", "_selected_action": [pool.pk]}, follow=True
    )
    assert Pool.objects.get(pk=pool.pk).paused is True
    assert any(level == "warning" for level, _ in shown(response))


def test_pools_publish_command(group: FabricGroup, sredis: redis.Redis, keys: KeySpace, capsys) -> None:
    sredis.hset(keys.pool_registry(), "orphan", "gone-group")  # a group deleted while Valkey was down
    call_command("pools_publish")
    out = capsys.readouterr().out
    assert "published g1" in out and "removed gone-group" in out
    assert registry(sredis, keys) == {"interactive": "g1", "backfill": "g1"}
    with pytest.raises(CommandError, match="unknown fabric group"):
        call_command("pools_publish", "nope")


def test_pools_publish_command_valkey_down(group: FabricGroup, valkey_down) -> None:
    with pytest.raises(CommandError, match="g1: Valkey unreachable"):
        call_command("pools_publish")


def test_invalid_stored_configuration_is_not_published(group: FabricGroup, sredis, keys) -> None:
    Pool.objects.filter(pool_id="backfill").update(min_concurrent=8, max_concurrent=8)
    FabricGroup.objects.filter(pk="g1").update(total_concurrency=10)
    group.refresh_from_db()
    result = services.group_publish(group=group)
    assert not result.ok and "not published, the configuration is invalid" in result.error
    assert published(sredis, keys, "g1") is None


def test_admin_pages_render(superuser_client: Client, group: FabricGroup) -> None:
    pool = Pool.objects.get(pool_id="interactive")
    for url in (
        "/admin/pools/fabricgroup/",
        "/admin/pools/fabricgroup/add/",
        f"/admin/pools/fabricgroup/{group.pk}/change/",
        "/admin/pools/pool/?paused__exact=0&group__group_id__exact=g1",
        "/admin/pools/pool/add/",
        f"/admin/pools/pool/{pool.pk}/change/",
    ):
        response = superuser_client.get(url)
        assert response.status_code == 200, url
    page = superuser_client.get(f"/admin/pools/pool/{pool.pk}/change/").content.decode()
    assert "Weight" in page and "Relative dispatch credit, not a concurrency limit" in page


def test_a_durable_groups_replica_count_is_published(
    group: FabricGroup, sredis: redis.Redis, keys: KeySpace
) -> None:
    group.delivery, group.persist_replicas = "durable", 2
    services.group_save(group=group)
    config = published(sredis, keys, "g1")
    assert config is not None and config.durable and config.persist_replicas == 2
