"""runtime.policy.reads: which pools' heads a round reads, as a table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.policy.reads import DEEP_READ_BYTES, DEEP_READ_MAX, PoolRead, next_depth, plan_reads, unread_skip
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


def test_a_pool_read_deeper_is_still_capped_by_the_local_free_slots() -> None:
    plan = plan_reads(
        POLICY,
        peek_depth=8,
        local_free=40,
        allowances={"b": 20},
        heads_cached=frozenset(),
        deeper={"a": 64, "b": 64, "p": 64},
    )
    assert {r.pool_id: r.depth for r in plan.reads} == {"a": 40, "b": 20, "p": 0}


BASE = 8


@pytest.mark.parametrize(
    ("depth", "read", "launched", "left", "size", "expected"),
    [
        (8, 8, 8, 100, 8_000, 16),  # all launched, more waiting: deeper
        (64, 64, 64, 1, 64_000, 128),
        (128, 128, 128, 500, 128_000, DEEP_READ_MAX),  # never past the most
        (8, 8, 8, 0, 8_000, 8),  # nothing left behind them: no deeper
        (16, 5, 5, 0, 5_000, 16),  # the list held less than the depth
        (32, 32, 31, 200, 32_000, BASE),  # a head read and not launched: back to the configured depth
        (64, 20, 20, 100, 20_000, 64),  # read less than the depth (local slots, a breaker): unchanged
        (8, 8, 8, 100, DEEP_READ_BYTES // 2 + 1, 8),  # heads too heavy to read twice as many
        (64, 64, 64, 100, DEEP_READ_BYTES + 1, BASE),  # heavier than the bound: back
        (32, 0, 0, 0, 0, 32),  # not read this round: nothing learnt
    ],
)
def test_how_deep_a_pool_is_read_next(depth, read, launched, left, size, expected) -> None:
    got = next_depth(depth, base=BASE, read=read, launched=launched, backlog_left=left, read_bytes=size)
    assert got == expected


@given(
    depth=st.integers(BASE, DEEP_READ_MAX),
    read=st.integers(0, DEEP_READ_MAX),
    launched=st.integers(0, DEEP_READ_MAX),
    left=st.integers(0, 10_000),
    size=st.integers(0, 4 * DEEP_READ_BYTES),
)
def test_the_read_depth_stays_between_the_configured_and_the_most(depth, read, launched, left, size) -> None:
    launched = min(launched, read)
    got = next_depth(depth, base=BASE, read=read, launched=launched, backlog_left=left, read_bytes=size)
    assert BASE <= got <= DEEP_READ_MAX
    if read and (launched < read or size > DEEP_READ_BYTES):
        assert got == BASE
    assert got <= 2 * depth
