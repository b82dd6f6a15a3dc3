"""runtime.policy.reads: which pools' heads a round reads, as a table."""

from __future__ import annotations

import pytest

from runtime.policy.reads import PoolRead, plan_reads, unread_skip
from runtime.policy.scheduler import GroupPolicy, PoolPolicy

POLICY = GroupPolicy(
    "drr",
    8,
    (
        PoolPolicy("a", quantum=1, max_concurrent=2),
        PoolPolicy("b", quantum=1, max_concurrent=3, max_burst_per_visit=12),
        PoolPolicy("p", quantum=1, max_concurrent=1, paused=True),
    ),
)


@pytest.mark.parametrize(
    ("local_free", "allowances", "cached", "depths", "refusals"),
    [
        (4, {}, set(), {"a": 4, "b": 4, "p": 0}, {"p": "paused"}),
        (16, {}, set(), {"a": 12, "b": 12, "p": 0}, {"p": "paused"}),
        (
            0,
            {},
            set(),
            {"a": 0, "b": 0, "p": 0},
            {"a": "local_capacity", "b": "local_capacity", "p": "paused"},
        ),
        (4, {"a": 0}, set(), {"a": 0, "b": 4, "p": 0}, {"a": "breaker_open", "p": "paused"}),
        (4, {"a": 1, "b": None}, set(), {"a": 1, "b": 4, "p": 0}, {"p": "paused"}),
        (2, {"a": 3, "b": None}, set(), {"a": 2, "b": 2, "p": 0}, {"p": "paused"}),
        (4, {"a": 0}, {"a", "p"}, {"a": 0, "b": 4, "p": 0}, {"a": "breaker_open", "p": "paused"}),
    ],
)
def test_heads_are_read_only_for_pools_that_could_launch(
    local_free, allowances, cached, depths, refusals
) -> None:
    plan = plan_reads(
        POLICY, peek_depth=8, local_free=local_free, allowances=allowances, heads_cached=frozenset(cached)
    )
    assert {r.pool_id: r.depth for r in plan.reads} == depths
    assert dict(plan.refusals) == refusals
    assert {r.pool_id for r in plan.reads if r.display_head} == {"a", "b", "p"} - set(cached)
    assert plan.reads[0] == PoolRead("a", depths["a"], 2, "a" not in cached)


@pytest.mark.parametrize(
    ("in_flight", "refusal", "expected"),
    [
        (2, None, "pool_cap"),
        (1, None, "group_cap"),
        (0, "paused", "paused"),
        (5, "breaker_open", "breaker_open"),
    ],
)
def test_the_skip_of_an_unread_pool(in_flight, refusal, expected) -> None:
    assert unread_skip(POLICY.pools[0], in_flight, refusal) == expected
