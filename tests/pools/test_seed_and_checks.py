"""The demo seed command and the dispatch.* system checks."""

from __future__ import annotations

import pytest
import redis
from django.contrib.auth import get_user_model
from django.core import checks
from django.core.management import CommandError, call_command

from pools.checks import TAG
from pools.models import Backend, FabricGroup, Pool
from runtime.queue.keys import KeySpace
from tests.support.publication import published, registry

pytestmark = pytest.mark.django_db(transaction=True)  # publication happens at commit

DEMO = {
    "interactive": (4, 4, 12, 4),
    "document-extract": (2, 0, 8, 2),
    "backfill": (1, 0, 8, 1),
    "default": (1, 0, 8, 1),
}


def demo_rows() -> dict[str, tuple[int, int, int, int]]:
    fields = ("pool_id", "quantum", "min_concurrent", "max_concurrent", "max_burst_per_visit")
    return {row[0]: row[1:] for row in Pool.objects.filter(group_id="demo").values_list(*fields)}


def test_seed_demo_creates_and_publishes(sredis: redis.Redis, keys: KeySpace) -> None:
    call_command("seed_demo")
    group = FabricGroup.objects.get(group_id="demo")
    assert (group.policy, group.total_concurrency) == ("drr", 16)
    assert group.backend.base_url == "http://127.0.0.1:8100/v1" and group.backend.kind == "vllm"
    assert demo_rows() == DEMO
    config = published(sredis, keys, "demo")
    # The backlog of backfill is bounded in the demo; the other pools are not.
    assert {p.pool_id: p.max_queued for p in config.pools} == {
        "interactive": None, "document-extract": None, "backfill": 200, "default": None,
    }  # fmt: skip
    assert config.default_endpoint_url == "http://127.0.0.1:8100/v1"
    assert [p.pool_id for p in config.pools] == list(DEMO)
    assert registry(sredis, keys) == dict.fromkeys(DEMO, "demo")


def test_seed_demo_is_idempotent_and_keeps_operator_edits(sredis: redis.Redis, keys: KeySpace) -> None:
    call_command("seed_demo")
    Pool.objects.filter(pool_id="backfill").update(quantum=3)
    Backend.objects.filter(pk="sim").update(max_waiting=9)
    call_command("seed_demo")
    assert Backend.objects.get(pk="sim").max_waiting == 9
    assert FabricGroup.objects.count() == 1 and Pool.objects.count() == 4
    assert demo_rows()["backfill"] == (3, 0, 8, 1)
    assert published(sredis, keys, "demo").pool("backfill").quantum == 3
    call_command("seed_demo", "--reset")
    assert demo_rows() == DEMO
    assert Backend.objects.get(pk="sim").max_waiting == 5


def test_seed_demo_endpoint_and_admin(sredis: redis.Redis, keys: KeySpace) -> None:
    call_command("seed_demo", "--endpoint", "http://sim:9000/v1", "--admin-password", "admin")
    assert published(sredis, keys, "demo").default_endpoint_url == "http://sim:9000/v1"
    user = get_user_model().objects.get(username="admin")
    assert user.is_superuser and user.check_password("admin")
    call_command("seed_demo", "--admin-password", "admin")
    assert get_user_model().objects.filter(username="admin").count() == 1


def test_seed_demo_refuses_bad_endpoint() -> None:
    with pytest.raises(CommandError, match="This URL embeds credentials"):
        call_command("seed_demo", "--endpoint", "http://u:p@sim:9000/v1")
    assert not FabricGroup.objects.exists() and not Backend.objects.exists()


def test_seed_demo_valkey_down(valkey_down) -> None:
    with pytest.raises(CommandError, match="demo group saved, but not published"):
        call_command("seed_demo")
    assert Pool.objects.filter(group_id="demo").count() == 4


def ids() -> list[str]:
    return sorted(message.id for message in checks.run_checks(tags=[TAG]))


def test_checks_clean_demo_config() -> None:
    call_command("seed_demo")
    assert ids() == []


def test_check_protected_slots_over_total() -> None:
    call_command("seed_demo")
    FabricGroup.objects.filter(pk="demo").update(
        total_concurrency=3
    )  # bypasses validation, like a bad import
    [message] = checks.run_checks(tags=[TAG])
    assert message.id == "dispatch.E001"
    assert "exceed the group's total concurrency (3)" in message.msg
    assert message.hint


def test_check_pool_without_backend() -> None:
    group = FabricGroup.objects.create(group_id="g", total_concurrency=4)
    backend = Backend.objects.create(backend_id="b", base_url="http://b:1/v1")
    Pool.objects.create(group=group, pool_id="p", max_concurrent=2)
    Pool.objects.create(group=group, pool_id="q", max_concurrent=2, backend=backend)
    Pool.objects.create(group=group, pool_id="off", max_concurrent=2, enabled=False)
    messages = checks.run_checks(tags=[TAG])
    assert [(m.id, m.obj.pool_id) for m in messages] == [("dispatch.E002", "p")]


def test_check_names_a_valkey_url_no_client_could_open(settings) -> None:
    settings.VALKEY_URL = "sentinel://s1:26379/mymaster"
    [message] = checks.run_checks(tags=[TAG])
    assert message.id == "dispatch.E003" and "must start with one of" in message.msg
    settings.VALKEY_URL = "valkey+sentinel://s1:26379,s2:26379,s3:26379/mymaster/0"
    assert checks.run_checks(tags=[TAG]) == []


def test_check_api_key_env_unset(monkeypatch) -> None:
    backend = Backend.objects.create(
        backend_id="b", base_url="http://b/", api_key_env="DISPATCH_TEST_UNSET_KEY"
    )
    FabricGroup.objects.create(group_id="g", backend=backend)
    monkeypatch.delenv("DISPATCH_TEST_UNSET_KEY", raising=False)
    [message] = checks.run_checks(tags=[TAG])
    assert message.id == "dispatch.W001" and message.level == checks.WARNING
    assert "DISPATCH_TEST_UNSET_KEY" in message.msg
    monkeypatch.setenv("DISPATCH_TEST_UNSET_KEY", "sk-test")
    assert ids() == []


def test_checks_skip_an_unmigrated_database(monkeypatch) -> None:
    from django.db import OperationalError

    from pools import checks as pool_checks

    def unmigrated() -> None:
        raise OperationalError("no such table: pools_fabricgroup")

    monkeypatch.setattr(pool_checks.selectors, "group_list", unmigrated)
    assert pool_checks.check_fabric_groups() == []
