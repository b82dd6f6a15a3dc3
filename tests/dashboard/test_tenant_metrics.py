"""Per-tenant /metrics of a fair pool (issue 22): the top 50 tenants by cost served, the rest summed."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dashboard.tenant_metrics import OTHER, TOP_TENANTS, capped


@pytest.mark.parametrize(
    ("served", "top", "expected"),
    [
        ({}, 2, []),
        ({"a": 1.0}, 2, [("a", 1.0)]),
        ({"a": 1.0, "b": 5.0}, 2, [("b", 5.0), ("a", 1.0)]),
        ({"a": 1.0, "b": 5.0, "c": 3.0, "d": 0.5}, 2, [("b", 5.0), ("c", 3.0), (OTHER, 1.5)]),
    ],
)
def test_capped_keeps_the_top_tenants_and_sums_the_rest(
    served: dict[str, float], top: int, expected: list[tuple[str, float]]
) -> None:
    assert capped(served, top) == expected


def test_metrics_show_a_fair_pools_top_tenants_and_other(client, fabric, sredis, keys) -> None:
    served = {f"key-{i}": float(i) for i in range(1, 71)}  # 70 tenants
    sredis.hset(keys.tenant_served("interactive"), mapping=served)
    sredis.zadd(keys.tenants("interactive"), {"key-70": 1.0, "key-3": 2.0})
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").content.decode())}
    samples = [s for s in families["llm_dispatch_tenant_cost_served"].samples if s.name.endswith("_total")]
    by_tenant = {s.labels["tenant"]: s.value for s in samples}
    assert {s.labels["pool"] for s in samples} == {"interactive"}  # backfill is not fair: no series
    assert len(by_tenant) == TOP_TENANTS + 1 and by_tenant["key-70"] == 70.0
    assert by_tenant[OTHER] == sum(range(1, 21))  # the 20 smallest, summed
    assert sum(by_tenant.values()) == sum(served.values())
    [backlogged] = families["llm_dispatch_tenants_backlogged"].samples
    assert backlogged.value == 2 and backlogged.labels == {"fabric_group": "g", "pool": "interactive"}
