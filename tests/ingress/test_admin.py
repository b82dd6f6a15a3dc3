"""Producer keys in the admin and the ``create_producer_key`` command: shown once, only a hash stored."""

from __future__ import annotations

import hashlib
import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from ingress import selectors
from ingress.models import ProducerKey
from pools.models import Backend, FabricGroup, Pool

pytestmark = pytest.mark.django_db


@pytest.fixture
def pools() -> None:
    backend = Backend.objects.create(backend_id="nowhere", base_url="http://127.0.0.1:9/v1")
    group = FabricGroup.objects.create(group_id="g", backend=backend)
    for pool_id in ("gold", "iron"):
        Pool.objects.create(group=group, pool_id=pool_id)


@pytest.fixture
def admin_client(settings: object) -> Client:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # type: ignore[attr-defined]
    get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.login(username="root", password="pw")
    return client


def test_the_command_prints_the_key_alone_on_its_last_line(pools: None) -> None:
    out = io.StringIO()
    call_command(
        "create_producer_key", "batch-jobs", "--pools", "gold,iron", "--default-pool", "iron", stdout=out
    )
    raw_key = out.getvalue().strip().splitlines()[-1]
    assert re.fullmatch(r"ldk-[A-Za-z0-9_-]{43}", raw_key)
    key = ProducerKey.objects.get(name="batch-jobs")
    assert key.key_hash == hashlib.sha256(raw_key.encode()).hexdigest()
    assert raw_key not in {str(v) for v in ProducerKey.objects.values_list().get()}
    grant = selectors.producer_key_grant(raw_key=raw_key)
    assert grant is not None and grant.pools == {"gold", "iron"} and grant.default_pool == "iron"


def test_the_command_refuses_unknown_pools_and_a_foreign_default(pools: None) -> None:
    with pytest.raises(CommandError, match=r"unknown pool.*nope"):
        call_command("create_producer_key", "k", "--pools", "gold,nope")
    with pytest.raises(CommandError, match="default_pool"):
        call_command("create_producer_key", "k", "--pools", "gold", "--default-pool", "iron")
    assert not ProducerKey.objects.exists()


def test_the_admin_shows_a_new_key_once_and_revokes_it(admin_client: Client, pools: None) -> None:
    response = admin_client.post(
        "/admin/ingress/producerkey/add/",
        {
            "name": "notebook",
            "allowed_pools": "gold",
            "default_pool": "gold",
            "enabled": "on",
            "tenant_weight": 1,
        },
        follow=True,
    )
    assert response.status_code == 200
    shown = re.search(r"ldk-[A-Za-z0-9_-]{43}", response.content.decode())
    assert shown is not None
    key = ProducerKey.objects.get(name="notebook")
    assert selectors.producer_key_grant(raw_key=shown.group()) is not None
    again = admin_client.get(f"/admin/ingress/producerkey/{key.pk}/change/").content.decode()
    assert shown.group() not in again
    admin_client.post(
        "/admin/ingress/producerkey/", {"action": "revoke", "_selected_action": [key.pk]}, follow=True
    )
    assert selectors.producer_key_grant(raw_key=shown.group()) is None


@pytest.mark.parametrize(
    ("weight", "message"),
    [
        (0, "The tenant weight must be above 0 and at most 1e+06"),
        (-2, "The tenant weight must be above 0"),
        (2_000_000, "at most 1e+06"),
        ("", "This field is required"),
    ],
)
def test_the_admin_refuses_a_bad_tenant_weight(
    admin_client: Client, pools: None, weight: object, message: str
) -> None:
    data = {
        "name": "k",
        "allowed_pools": "gold",
        "default_pool": "gold",
        "enabled": "on",
        "tenant_weight": weight,
    }
    response = admin_client.post("/admin/ingress/producerkey/add/", data)
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not ProducerKey.objects.exists()


def test_a_key_keeps_its_tenant_weight_and_sub_tenant_switch(admin_client: Client, pools: None) -> None:
    data = {"name": "k", "allowed_pools": "gold", "default_pool": "gold", "enabled": "on"}
    data |= {"tenant_weight": 2.5, "allow_sub_tenant": "on"}
    assert admin_client.post("/admin/ingress/producerkey/add/", data).status_code == 302
    key = ProducerKey.objects.get(name="k")
    assert (key.tenant_weight, key.allow_sub_tenant) == (2.5, True)
