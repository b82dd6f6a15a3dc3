"""Tenant fairness settings (issue 22): refused with a clear message when bad, published when good."""

from __future__ import annotations

import orjson
import pytest
import redis
from django.test import Client

from pools import selectors, services
from pools.models import FabricGroup, Pool
from runtime.queue.keys import KeySpace
from tests.support.pools_admin import POOL_ADD, errors_of, group_form, pool_post
from tests.support.publication import published

pytestmark = pytest.mark.django_db(transaction=True)  # publication happens at commit


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tenant_fairness": "bytes"}, "Select a valid choice"),
        ({"tenant_input_weight": -1}, "A token weight must be a finite number, 0 or more"),
        ({"tenant_output_weight": "inf"}, "Enter a number"),
        (
            {"tenant_fairness": "tokens", "tenant_input_weight": 0, "tenant_output_weight": 0},
            "at least one token weight must be above 0",
        ),
        ({"tenant_default_output_tokens": -1}, "greater than or equal to 0"),
        ({"tenant_default_output_tokens": 10**8}, "Default output tokens must be between 0 and 10000000"),
        ({"max_queued_per_tenant": 0}, "Max queued per tenant must be at least 1, or blank for no cap"),
        (
            {"max_queued": 10, "max_queued_per_tenant": 11},
            "Max queued per tenant (11) must not exceed max queued (10)",
        ),
    ],
)
def test_pool_add_refuses_bad_tenant_values(
    superuser_client: Client, group: FabricGroup, values: dict[str, object], message: str
) -> None:
    response = superuser_client.post(POOL_ADD, pool_post(group, **values))
    assert response.status_code == 200
    assert message in errors_of(response)
    assert Pool.objects.count() == 2


def test_zero_weights_are_fine_while_fairness_is_off_or_by_requests(
    superuser_client: Client, group: FabricGroup
) -> None:
    values = {"tenant_fairness": "requests", "tenant_input_weight": 0, "tenant_output_weight": 0}
    response = superuser_client.post(POOL_ADD, pool_post(group, **values))
    assert response.status_code == 302, errors_of(response)


def test_tenant_settings_reach_the_published_configuration(
    superuser_client: Client, group: FabricGroup, sredis: redis.Redis, keys: KeySpace
) -> None:
    values = {
        "tenant_fairness": "tokens",
        "tenant_input_weight": 0.5,
        "tenant_output_weight": 3,
        "tenant_default_output_tokens": 700,
        "max_queued": 100,
        "max_queued_per_tenant": 20,
    }
    response = superuser_client.post(POOL_ADD, pool_post(group, **values))
    assert response.status_code == 302, errors_of(response)
    config = published(sredis, keys, "g1")
    assert config is not None and config == selectors.group_config(group=group, version=config.version)
    pool = config.pool("new-pool")
    assert pool is not None
    assert (pool.tenant_fairness, pool.tenant_input_weight, pool.tenant_output_weight) == ("tokens", 0.5, 3.0)
    assert (pool.tenant_default_output_tokens, pool.max_queued_per_tenant) == (700, 20)
    cost = pool.tenant_cost()
    assert cost is not None and cost.of(100, 10) == 80.0
    untouched = config.pool("interactive")
    assert untouched is not None and untouched.tenant_fairness == "off" and untouched.tenant_cost() is None


def test_group_cost_mode_is_published(
    superuser_client: Client, backend: object, sredis: redis.Redis, keys
) -> None:
    data = group_form({"group_id": "g2", "cost_mode": "tokens", "backend": "sim"}, [{"pool_id": "p1"}])
    response = superuser_client.post("/admin/pools/fabricgroup/add/", data)
    assert response.status_code == 302, errors_of(response)
    config = published(sredis, keys, "g2")
    assert config is not None and config.cost_mode == "tokens"


def test_group_add_refuses_an_unknown_cost_mode(superuser_client: Client, backend: object) -> None:
    data = group_form({"group_id": "g2", "cost_mode": "pages", "backend": "sim"}, [{"pool_id": "p1"}])
    response = superuser_client.post("/admin/pools/fabricgroup/add/", data)
    assert "Select a valid choice" in errors_of(response)
    assert not FabricGroup.objects.filter(group_id="g2").exists()


def test_a_configuration_published_before_tenants_still_decodes(
    group: FabricGroup, sredis: redis.Redis, keys: KeySpace
) -> None:
    """A dispatcher of this version reads what an older admin published: the defaults fill in."""
    result = services.group_publish(group=group)
    raw = orjson.loads(sredis.get(keys.group_config("g1")))
    del raw["cost_mode"]
    for pool in raw["pools"]:
        for name in list(pool):
            if "tenant" in name:
                del pool[name]
    sredis.set(keys.group_config("g1"), orjson.dumps(raw))
    old = published(sredis, keys, "g1")
    assert old == selectors.group_config(group=group, version=result.version)  # the defaults are the model's
