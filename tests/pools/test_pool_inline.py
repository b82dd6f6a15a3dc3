"""The group page's pool inline: an existing pool's id is fixed, as on the pool's own page."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from pools.models import FabricGroup, Pool
from tests.support.pools_admin import existing_rows, group_form

pytestmark = pytest.mark.django_db


def change_url(group: FabricGroup) -> str:
    return f"/admin/pools/fabricgroup/{group.pk}/change/"


def test_existing_pool_ids_are_shown_but_not_editable(superuser_client: Client, group: FabricGroup) -> None:
    page = superuser_client.get(change_url(group)).content.decode()
    ids = [p.pool_id for p in Pool.objects.filter(group=group).order_by("sort_order", "pool_id")]
    for i, pool_id in enumerate(ids):
        field = re.search(rf'<input [^>]*name="pools-{i}-pool_id"[^>]*>', page)
        assert field is not None and f'value="{pool_id}"' in field[0]
        assert " disabled" in field[0]  # shown, but nobody can type into it
    # The empty row that "Add another pool" copies still takes an id.
    empty = re.search(r'<input [^>]*name="pools-__prefix__-pool_id"[^>]*>', page)
    assert empty is not None and " disabled" not in empty[0]


def test_a_posted_id_change_of_an_existing_pool_is_ignored(
    superuser_client: Client, group: FabricGroup
) -> None:
    rows = existing_rows(group, backfill={"quantum": 3})
    renamed = next(row for row in rows if row["pool_id"] == "backfill")
    renamed["pool_id"] = "renamed"  # what a hand-made POST could send
    response = superuser_client.post(
        change_url(group), group_form({"group_id": group.group_id}, rows, initial=2)
    )
    assert response.status_code == 302
    assert not Pool.objects.filter(pool_id="renamed").exists()
    assert Pool.objects.get(pool_id="backfill").quantum == 3  # the rest of the row was saved


def test_a_new_row_still_takes_an_id(superuser_client: Client, group: FabricGroup) -> None:
    rows = [*existing_rows(group), {"pool_id": "fresh", "group": group.pk}]
    response = superuser_client.post(
        change_url(group), group_form({"group_id": group.group_id}, rows, initial=2)
    )
    assert response.status_code == 302
    assert Pool.objects.get(pool_id="fresh").group_id == group.group_id
