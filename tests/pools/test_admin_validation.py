"""Every bad value is refused by the real admin pages, with a message that says what is wrong."""

from __future__ import annotations

import pytest
from django.test import Client

from pools.models import FabricGroup, Pool
from tests.support.pools_admin import (
    POOL_ADD,
    POOL_DEFAULTS,
    changelist_form,
    errors_of,
    existing_rows,
    group_form,
    pool_post,
)

pytestmark = pytest.mark.django_db

GROUP_ADD = "/admin/pools/fabricgroup/add/"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"min_concurrent": 9, "max_concurrent": 8}, "Min concurrent (9) must not exceed max concurrent (8)"),
        ({"max_concurrent": 0}, "Max concurrent must be at least 1"),
        ({"quantum": 0}, "Weight must be at least 1"),
        ({"max_burst_per_visit": 0}, "Max burst per visit must be at least 1"),
        ({"pool_id": "Bad Id!"}, "is not a valid id"),
        ({"pool_id": "-leading-dash"}, "is not a valid id"),
        ({"pool_id": "x" * 64}, "at most 63 characters"),
        ({"pool_id": "interactive"}, "A pool with this id already exists"),
        ({"max_attempts": 0}, "A request gets at least one attempt"),
        ({"retry_backoff_base_s": 5, "retry_backoff_cap_s": 1}, "The backoff cap must not be below its base"),
        ({"retry_backoff_base_s": -1}, "greater than or equal to 0"),
        ({"backend": "no-such-backend"}, "Select a valid choice"),
        ({"max_queued": 0}, "Max queued must be at least 1, or blank for an unbounded queue"),
        ({"max_queue_wait_s": 0}, "Max queue wait must be more than 0 seconds"),
        ({"max_queue_wait_s": "soon"}, "Enter a number"),
        (
            {"min_concurrent": 13, "max_concurrent": 13},
            "protected slots of enabled pools (sum of min concurrent = 17) exceed "
            "the group's total concurrency (16)",
        ),
    ],
)
def test_pool_add_refuses_bad_values(superuser_client: Client, group: FabricGroup, values, message) -> None:
    response = superuser_client.post(POOL_ADD, pool_post(group, **values))
    assert response.status_code == 200
    assert message in errors_of(response)
    assert Pool.objects.count() == 2


def test_disabled_pool_does_not_count_towards_protected_slots(
    superuser_client: Client, group: FabricGroup
) -> None:
    values = {"min_concurrent": 13, "max_concurrent": 13, "enabled": False}
    response = superuser_client.post(POOL_ADD, pool_post(group, **values))
    assert response.status_code == 302, errors_of(response)
    assert Pool.objects.get(pool_id="new-pool").enabled is False


def test_pool_change_checks_the_group(superuser_client: Client, group: FabricGroup) -> None:
    backfill = Pool.objects.get(pool_id="backfill")
    values = {k: getattr(backfill, k) for k in POOL_DEFAULTS if k != "backend"}
    values = {k: "" if v is None else v for k, v in values.items()} | {
        "min_concurrent": 8,
        "max_concurrent": 8,
    }
    group.total_concurrency = 11
    group.save()
    response = superuser_client.post(f"/admin/pools/pool/{backfill.pk}/change/", pool_post(group, **values))
    assert "sum of min concurrent = 12" in errors_of(response)
    assert Pool.objects.get(pk=backfill.pk).min_concurrent == 0


@pytest.mark.parametrize(
    ("group_values", "message"),
    [
        ({"total_concurrency": 0}, "Total concurrency must be at least 1"),
        ({"group_id": "Has Spaces"}, "is not a valid id"),
        ({"backend": "no-such-backend"}, "Select a valid choice"),
    ],
)
def test_group_add_refuses_bad_values(superuser_client: Client, backend, group_values, message) -> None:
    data = group_form({"group_id": "g2", **group_values}, [{"pool_id": "p1"}])
    response = superuser_client.post(GROUP_ADD, data)
    assert response.status_code == 200
    assert message in errors_of(response)
    assert not FabricGroup.objects.exists()


def test_group_add_inline_sum_of_protected_slots(superuser_client: Client, db) -> None:
    rows = [
        {"pool_id": "a", "min_concurrent": 6, "max_concurrent": 8},
        {"pool_id": "b", "min_concurrent": 6, "max_concurrent": 8, "sort_order": 1},
    ]
    data = group_form({"group_id": "g2", "total_concurrency": 10}, rows)
    response = superuser_client.post(GROUP_ADD, data)
    assert "(sum of min concurrent = 12) exceed the group's total concurrency (10)" in errors_of(response)
    assert not FabricGroup.objects.exists()
    assert not Pool.objects.exists()


def test_group_add_inline_duplicate_pool_ids(superuser_client: Client, db) -> None:
    data = group_form({"group_id": "g2"}, [{"pool_id": "same"}, {"pool_id": "same", "sort_order": 1}])
    response = superuser_client.post(GROUP_ADD, data)
    assert "Two rows use the same pool id" in errors_of(response)
    assert not Pool.objects.exists()


def test_group_add_inline_row_errors(superuser_client: Client, db) -> None:
    rows = [{"pool_id": "a", "min_concurrent": 5, "max_concurrent": 2}, {"pool_id": "b", "quantum": 0}]
    response = superuser_client.post(GROUP_ADD, group_form({"group_id": "g2"}, rows))
    text = errors_of(response)
    assert "Min concurrent (5) must not exceed max concurrent (2)" in text
    assert "Weight must be at least 1" in text


def test_group_change_lower_total_below_protected_slots(superuser_client: Client, group: FabricGroup) -> None:
    data = group_form({"total_concurrency": 3}, existing_rows(group), initial=2)
    response = superuser_client.post(f"/admin/pools/fabricgroup/{group.pk}/change/", data)
    assert "exceed the group's total concurrency (3)" in errors_of(response)
    assert FabricGroup.objects.get(pk=group.pk).total_concurrency == 16


def test_group_change_batch_edit_is_judged_on_submitted_values(
    superuser_client: Client, group: FabricGroup
) -> None:
    """Lowering the total and the protected slots in one submit is valid although each alone is not."""
    rows = existing_rows(group, interactive={"min_concurrent": 2})
    data = group_form({"total_concurrency": 3}, rows, initial=2)
    response = superuser_client.post(f"/admin/pools/fabricgroup/{group.pk}/change/", data)
    assert response.status_code == 302, errors_of(response)
    assert FabricGroup.objects.get(pk=group.pk).total_concurrency == 3
    assert Pool.objects.get(pool_id="interactive").min_concurrent == 2


def test_group_change_deleted_rows_do_not_count(superuser_client: Client, group: FabricGroup) -> None:
    rows = existing_rows(group, backfill={"min_concurrent": 8}, interactive={"DELETE": True})
    data = group_form({"total_concurrency": 8}, rows, initial=2)
    response = superuser_client.post(f"/admin/pools/fabricgroup/{group.pk}/change/", data)
    assert response.status_code == 302, errors_of(response)
    assert list(Pool.objects.values_list("pool_id", flat=True)) == ["backfill"]


def test_changelist_edit_refuses_protected_slots_over_total(
    superuser_client: Client, group: FabricGroup
) -> None:
    pools = list(Pool.objects.order_by("pk"))
    data = changelist_form(
        pools, backfill={"min_concurrent": 8, "max_concurrent": 8}, interactive={"min_concurrent": 9}
    )
    response = superuser_client.post("/admin/pools/pool/", data)
    assert "group 'g1': protected slots of enabled pools (sum of min concurrent = 17)" in errors_of(response)
    assert Pool.objects.get(pool_id="backfill").min_concurrent == 0


def test_changelist_edit_refuses_row_values(superuser_client: Client, group: FabricGroup) -> None:
    pools = list(Pool.objects.order_by("pk"))
    response = superuser_client.post(
        "/admin/pools/pool/", changelist_form(pools, backfill={"max_concurrent": 0})
    )
    assert "Max concurrent must be at least 1" in errors_of(response)
