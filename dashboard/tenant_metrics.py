"""Per-tenant ``/metrics`` series of the pools with tenant fairness (issue 22), capped.

One series per tenant would let a pool with 100,000 tenants (one per ingress sub-tenant) blow up
every Prometheus that scrapes us, so each pool shows its :data:`TOP_TENANTS` tenants by cost served
(``hash:llm:tenant-served:{pool}``: each completed call's usage, or its estimate when the backend
reported none, before the tenant's weight) and sums the rest under ``tenant="other"``. Pools without
fairness have no series.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from pools.connections import key_space, valkey_client

__all__ = ["OTHER", "TOP_TENANTS", "TenantFamilies", "capped"]

TOP_TENANTS = 50
OTHER = "other"  # never a tenant id's whole value: ingress tenants start with "key-"


def capped(served: Mapping[str, float], top: int = TOP_TENANTS) -> list[tuple[str, float]]:
    """The ``top`` tenants by cost served, then ``other`` with the rest's sum (when there is a rest)."""
    best = heapq.nlargest(top, served.items(), key=lambda item: (item[1], item[0]))
    rest = sum(served.values()) - sum(v for _, v in best)
    return best + ([(OTHER, rest)] if len(served) > top else [])


def _decoded(raw: Mapping[bytes, bytes]) -> dict[str, float]:
    return {k.decode(): float(v) for k, v in raw.items()}


class TenantFamilies:
    """The tenant families of one scrape."""

    def __init__(self) -> None:
        labels = ["fabric_group", "pool", "tenant"]
        self.served = CounterMetricFamily(
            "llm_dispatch_tenant_cost_served",
            f"Cost served per tenant of a fair pool (input_weight x prompt + output_weight x output tokens, "
            f'or requests), top {TOP_TENANTS} per pool, the rest as tenant="other"',
            labels=labels,
        )
        self.backlogged = GaugeMetricFamily(
            "llm_dispatch_tenants_backlogged",
            "Tenants with queued requests in a fair pool",
            labels=labels[:2],
        )

    def add(self, group_id: str, pool_ids: Iterable[str], client: object = None) -> None:
        """Reads the served hash and backlog of each pool in one round trip (raises Valkey errors)."""
        keys, pool_ids = key_space(), list(pool_ids)
        pipe = valkey_client(client).pipeline(transaction=False)  # type: ignore[arg-type]
        for pool_id in pool_ids:
            pipe.hgetall(keys.tenant_served(pool_id))
            pipe.zcard(keys.tenants(pool_id))
        read = pipe.execute()
        for i, pool_id in enumerate(pool_ids):
            served, backlogged = _decoded(read[2 * i]), int(read[2 * i + 1])
            if not served and not backlogged:
                continue  # fairness off (or never used): no series
            for tenant, value in capped(served):
                self.served.add_metric([group_id, pool_id, tenant], value)
            self.backlogged.add_metric([group_id, pool_id], backlogged)

    def all(self) -> list[CounterMetricFamily | GaugeMetricFamily]:
        return [self.served, self.backlogged]
