"""Each call's plan, drawn from the config, the ``sim`` hook and a seeded RNG (no server)."""

from __future__ import annotations

import math
import random

import pytest

from simulator.behaviour import Behaviour
from simulator.config import SimulatorConfig

REQUEST: dict[str, object] = {"messages": [{"role": "user", "content": "hi"}]}


def behaviour(**config: object) -> Behaviour:
    return Behaviour(SimulatorConfig(**config), random.Random(4))  # type: ignore[arg-type]


def test_the_same_seed_draws_the_same_plans() -> None:
    config = {
        "latency_ms": 50,
        "latency_sigma": 0.5,
        "error_rate": 0.3,
        "hang_rate": 0.1,
        "rate_limit_rate": 0.2,
    }
    one, two = behaviour(**config), behaviour(**config)
    assert [(one.rate_limited(), one.plan(REQUEST, {})) for _ in range(50)] == [
        (two.rate_limited(), two.plan(REQUEST, {})) for _ in range(50)
    ]


@pytest.mark.parametrize(
    ("config", "sim", "expected"),
    [
        ({}, {}, {"latency_s": 0.0, "status": 0, "hang": False, "completion_tokens": 16}),
        ({"latency_ms": 80}, {}, {"latency_s": 0.08}),
        ({"latency_ms": 80}, {"latency_ms": 5}, {"latency_s": 0.005}),
        ({"error_rate": 1.0}, {"status": 200}, {"status": 0}),  # the hook forces success
        ({}, {"status": 503, "message": "down"}, {"status": 503, "message": "down"}),
        ({"hang_rate": 1.0}, {}, {"hang": True}),
        ({}, {"hang": True}, {"hang": True}),
        ({}, {"completion_tokens": 3}, {"completion_tokens": 3, "finish": "stop"}),
    ],
)
def test_plan_follows_config_and_hook(
    config: dict[str, object], sim: dict[str, object], expected: dict
) -> None:
    plan = behaviour(**config).plan(REQUEST, sim)
    assert {key: getattr(plan, key) for key in expected} == expected


def test_max_tokens_caps_the_reply_with_finish_length() -> None:
    plan = behaviour().plan({**REQUEST, "max_tokens": 4}, {})
    assert (plan.completion_tokens, plan.finish, plan.timing.tokens) == (4, "length", 4)


def test_timing_puts_the_first_token_after_latency_and_ttft() -> None:
    plan = behaviour(latency_ms=100, ttft_ms=50, itl_ms=10).plan(REQUEST, {})
    assert plan.timing.first_token_s == pytest.approx(0.15)
    assert plan.timing.done_s == pytest.approx(0.15 + 15 * 0.01)
    hooked = behaviour(ttft_ms=50, tokens_per_second=100).plan(REQUEST, {"ttft_ms": 0, "itl_ms": 2})
    assert (hooked.timing.first_token_s, hooked.timing.token_interval_s) == (0.0, 0.002)


def test_a_failing_call_generates_no_tokens() -> None:
    plan = behaviour(latency_ms=30).plan(REQUEST, {"status": 500})
    assert plan.timing.tokens == 0 and plan.timing.done_s == pytest.approx(0.03)


def test_latency_jitter_is_lognormal_around_the_median() -> None:
    jittered = behaviour(latency_ms=100, latency_sigma=0.5)
    draws = sorted(jittered.plan(REQUEST, {}).latency_s for _ in range(4000))
    assert draws[0] > 0
    assert draws[2000] == pytest.approx(0.1, rel=0.05)  # the median is latency_ms
    # exp(N(0, 0.5)): a sixth of the draws lie below exp(-0.5) and a sixth above exp(0.5) times the median.
    assert draws[int(4000 * 0.1587)] == pytest.approx(0.1 * math.exp(-0.5), rel=0.05)
    assert draws[int(4000 * 0.8413)] == pytest.approx(0.1 * math.exp(0.5), rel=0.05)
    fixed = behaviour(latency_ms=100)
    assert {fixed.plan(REQUEST, {}).latency_s for _ in range(20)} == {0.1}  # sigma 0: no jitter


def test_rate_limit_share_follows_the_rate() -> None:
    limiter = behaviour(rate_limit_rate=0.25)
    share = sum(limiter.rate_limited() for _ in range(4000)) / 4000
    assert 0.2 < share < 0.3
    assert not any(behaviour().rate_limited() for _ in range(100))


def test_fail_times_fails_only_the_first_calls_of_a_key() -> None:
    sim = {"status": 503, "fail_times": 2, "key": "r-1"}
    fates = behaviour()
    assert [fates.plan(REQUEST, sim).status for _ in range(4)] == [503, 503, 0, 0]
    assert fates.plan(REQUEST, {**sim, "key": "r-2"}).status == 503  # each key has its own count
    assert fates.calls_by_key == {"r-1": 4, "r-2": 1}
