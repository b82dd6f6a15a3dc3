"""Model aliases: validated in the model and on the group's admin page, published with the group."""

from __future__ import annotations

import pytest
import redis
from django.core.exceptions import ValidationError
from django.test import Client

from pools import selectors, services
from pools.models import FabricGroup, ModelAlias, Pool
from runtime.errors import MalformedEnvelope
from runtime.queue.keys import KeySpace
from runtime.wire import groupconfig
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from tests.support.pools_admin import existing_rows, group_form
from tests.support.publication import published

pytestmark = pytest.mark.django_db(transaction=True)  # publication happens at commit

LLAMA = "meta-llama/Llama-3-8B-Instruct"


def other_group() -> FabricGroup:
    group = FabricGroup.objects.create(group_id="g9", name="G9", policy="fifo")
    Pool.objects.create(group=group, pool_id="elsewhere")
    return group


@pytest.mark.parametrize("name", ["", " batch", "batch llama", "/leading-slash", "tab\tin", "x" * 201])
def test_an_alias_must_look_like_a_model_name(group: FabricGroup, name: str) -> None:
    alias = ModelAlias(group=group, alias=name, pool=Pool.objects.get(pool_id="backfill"))
    with pytest.raises(ValidationError) as caught:
        alias.full_clean()
    assert "alias" in caught.value.message_dict


def test_an_alias_must_name_a_pool_of_its_own_group(group: FabricGroup) -> None:
    other_group()
    alias = ModelAlias(group=group, alias="batch/llama-3-8b", pool=Pool.objects.get(pool_id="elsewhere"))
    with pytest.raises(ValidationError) as caught:
        alias.full_clean()
    assert caught.value.message_dict == {"pool": ["The pool must be one of this group's pools."]}


def test_an_alias_is_one_name_over_the_whole_fleet(group: FabricGroup) -> None:
    other = other_group()
    ModelAlias.objects.create(group=group, alias="shared", pool=Pool.objects.get(pool_id="backfill"))
    twin = ModelAlias(group=other, alias="shared", pool=Pool.objects.get(pool_id="elsewhere"))
    with pytest.raises(ValidationError) as caught:
        twin.full_clean()
    assert "aliases are names over the whole fleet" in caught.value.message_dict["alias"][0]


def test_the_group_page_adds_an_alias_and_publishes_it(
    superuser_client: Client, group: FabricGroup, sredis: redis.Redis, keys: KeySpace
) -> None:
    page = superuser_client.get(f"/admin/pools/fabricgroup/{group.pk}/change/")
    assert b"a request whose model is an alias goes to its pool" in page.content
    backfill = Pool.objects.get(pool_id="backfill")
    aliases = [
        {"alias": "batch/llama-3-8b", "pool": backfill.pk, "backend_model": LLAMA},
        {"alias": "chat-fast", "pool": Pool.objects.get(pool_id="interactive").pk},  # blank: the alias
    ]
    data = group_form({"name": "G1", "backend": "sim"}, existing_rows(group), initial=2, aliases=aliases)
    response = superuser_client.post(f"/admin/pools/fabricgroup/{group.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    config = published(sredis, keys, "g1")
    assert config is not None and config.aliases == (
        groupconfig.ModelAlias("batch/llama-3-8b", "backfill", LLAMA),
        groupconfig.ModelAlias("chat-fast", "interactive", "chat-fast"),
    )


def test_the_group_page_offers_only_its_own_pools_and_shows_a_bad_row(
    superuser_client: Client, group: FabricGroup, sredis: redis.Redis, keys: KeySpace
) -> None:
    elsewhere = other_group().pools.get()
    url = f"/admin/pools/fabricgroup/{group.pk}/change/"
    page = superuser_client.get(url).content.decode()
    assert 'name="aliases-__prefix__-pool"' in page and ">elsewhere<" not in page
    bad = [{"alias": "bad name", "pool": elsewhere.pk}]
    data = group_form({"name": "G1", "backend": "sim"}, existing_rows(group), initial=2, aliases=bad)
    response = superuser_client.post(url, data)
    assert response.status_code == 200  # the form again, with the row's errors
    errors = response.context["inline_admin_formsets"][1].formset.errors[0]
    assert "is not a model name" in errors["alias"][0]
    assert "Select a valid choice" in errors["pool"][0]
    assert not ModelAlias.objects.exists() and published(sredis, keys, "g1") is None


def test_a_deleted_pool_takes_its_aliases_along(
    group: FabricGroup, sredis: redis.Redis, keys: KeySpace
) -> None:
    backfill = Pool.objects.get(pool_id="backfill")
    ModelAlias.objects.create(group=group, alias="batch/x", pool=backfill)
    services.pool_delete(pool=backfill)
    assert selectors.group_config(group=group).aliases == ()


def test_a_published_alias_must_name_a_pool_of_the_group() -> None:
    config = GroupConfig("g", pools=(PoolConfig("p"),), aliases=(groupconfig.ModelAlias("a", "p", "m"),))
    assert GroupConfig.decode(config.encode()) == config
    broken = GroupConfig("g", pools=(PoolConfig("p"),), aliases=(groupconfig.ModelAlias("a", "q", "m"),))
    with pytest.raises(MalformedEnvelope, match="model alias 'a' names pool 'q'"):
        GroupConfig.decode(broken.encode())
    assert GroupConfig.decode(b'{"group_id": "old"}').aliases == ()  # published before aliases existed
