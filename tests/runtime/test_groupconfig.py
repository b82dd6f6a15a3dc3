"""Tests for runtime.wire.groupconfig: where each pool's calls go, and the indexes behind it."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from runtime.wire.backendconfig import BackendConfig
from runtime.wire.groupconfig import GroupConfig, PoolConfig

SHARED = BackendConfig("shared", "http://shared:8000/v1")
OWN = BackendConfig("own", "http://own:8000/v1")
CONFIG = GroupConfig(
    group_id="g",
    default_endpoint_url="http://shared:8000/v1",
    backend_id="shared",
    backends=(SHARED, OWN),
    pools=(
        PoolConfig("plain"),  # the group's backend
        PoolConfig("own", backend_id="own"),  # its own backend
        PoolConfig("url", endpoint_url="http://pinned:9000/v1", backend_id="own"),  # URL as published
        PoolConfig("off", enabled=False, backend_id="own"),
    ),
)
BARE = GroupConfig(group_id="bare", default_endpoint_url="http://bare:1/v1", pools=(PoolConfig("p"),))


@pytest.mark.parametrize(
    ("config", "pool_id", "backend", "endpoint"),
    [
        (CONFIG, "plain", SHARED, "http://shared:8000/v1"),
        (CONFIG, "own", OWN, "http://own:8000/v1"),
        (CONFIG, "url", OWN, "http://pinned:9000/v1"),
        (CONFIG, "off", OWN, "http://own:8000/v1"),  # disabled pools still resolve (in-flight calls)
        (CONFIG, "unknown", SHARED, "http://shared:8000/v1"),  # not in the group: the group's backend
        (BARE, "p", None, "http://bare:1/v1"),
        (BARE, "unknown", None, "http://bare:1/v1"),
    ],
)
def test_route_endpoint_and_backend_agree(
    config: GroupConfig, pool_id: str, backend: BackendConfig | None, endpoint: str
) -> None:
    route = config.route(pool_id)
    assert (route.backend, route.endpoint) == (backend, endpoint)
    assert route.backend_id == (backend.backend_id if backend else "")
    assert config.endpoint_for(pool_id) == endpoint
    assert config.backend_for(pool_id) == backend


def test_lookups_by_id() -> None:
    assert CONFIG.pool("own") == CONFIG.pools[1]
    assert CONFIG.pool("missing") is None
    assert CONFIG.backend("own") is OWN
    assert CONFIG.backend("missing") is None
    assert [p.pool_id for p in CONFIG.enabled_pools] == ["plain", "own", "url"]


def test_first_of_a_repeated_pool_id_wins_as_a_scan_found_it() -> None:
    config = GroupConfig(group_id="g", pools=(PoolConfig("p", quantum=2), PoolConfig("p", quantum=3)))
    assert config.pool("p") == PoolConfig("p", quantum=2)


def test_cached_lookups_change_neither_equality_nor_encoding() -> None:
    fresh = GroupConfig.decode(CONFIG.encode())
    CONFIG.route("own"), CONFIG.pool("own"), CONFIG.enabled_pools  # fill the caches of one side
    assert fresh == CONFIG
    assert fresh.encode() == CONFIG.encode()


def test_a_replaced_config_answers_from_its_own_fields() -> None:
    CONFIG.route("plain")
    moved = dataclasses.replace(CONFIG, backend_id="own")
    assert moved.route("plain").backend is OWN
    assert CONFIG.route("plain").backend is SHARED


# -------------------------------------------------------------------- tenant fairness settings (issue 22)

from runtime.errors import MalformedEnvelope  # noqa: E402


def test_tenant_settings_round_trip() -> None:
    pool = PoolConfig("p", tenant_fairness="tokens", tenant_output_weight=2.0, max_queued_per_tenant=5)
    config = dataclasses.replace(CONFIG, pools=(pool,), cost_mode="tokens")
    assert GroupConfig.decode(config.encode()) == config


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cost_mode": "pages"}, "unknown cost mode 'pages'"),
        ({"pools": [{"pool_id": "p", "tenant_fairness": "bytes"}]}, "unknown tenant_fairness 'bytes'"),
        (
            {"pools": [{"pool_id": "p", "tenant_fairness": "tokens", "tenant_input_weight": -1}]},
            "input_weight",
        ),
    ],
)
def test_bad_tenant_settings_are_malformed(change: dict[str, object], message: str) -> None:
    raw = orjson.loads(BARE.encode()) | change
    with pytest.raises(MalformedEnvelope, match=message):
        GroupConfig.decode(orjson.dumps(raw))


def test_token_weights_hold_whatever_the_tenant_fairness() -> None:
    pool = PoolConfig("p", tenant_input_weight=2.0, tenant_output_weight=3.0)
    assert pool.tenant_cost() is None  # fairness off: FIFO inside the pool
    assert pool.token_weights().of(10, 10) == 50.0  # still what the group's DRR counts in tokens mode
    requests = dataclasses.replace(pool, tenant_fairness="requests").tenant_cost()
    assert requests is not None and requests.of(10, 10) == 1.0
