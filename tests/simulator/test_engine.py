"""The simulated engine's decisions (pure) and its FIFO shell, without HTTP."""

from __future__ import annotations

import asyncio

import pytest

from simulator.engine import Engine, Job, Timing, can_admit, kv_usage
from tests.support.waiting import wait_until


@pytest.mark.parametrize(
    ("elapsed", "generated"),
    [(0.0, 0), (0.099, 0), (0.1, 1), (0.149, 1), (0.15, 2), (0.35, 6), (10.0, 6)],
)
def test_tokens_generated_over_time(elapsed: float, generated: int) -> None:
    timing = Timing(first_token_s=0.1, token_interval_s=0.05, tokens=6)
    assert timing.generated(elapsed) == generated
    assert timing.done_s == pytest.approx(0.35)


def test_instant_tokens_and_empty_replies() -> None:
    assert Timing(first_token_s=0.2, token_interval_s=0, tokens=5).generated(0.2) == 5
    empty = Timing(first_token_s=0.2, token_interval_s=0.1, tokens=0)
    assert empty.generated(9) == 0 and empty.done_s == 0.2


@pytest.mark.parametrize(
    ("running", "reserved", "need", "max_running", "capacity", "admit"),
    [
        (0, 0, 10, 0, 0, True),  # unlimited
        (3, 0, 10, 4, 0, True),
        (4, 0, 10, 4, 0, False),  # slots full
        (1, 90, 10, 0, 100, True),  # exactly fits
        (1, 91, 10, 0, 100, False),  # cache full
        (0, 0, 101, 4, 100, False),  # never fits (the server refuses it with 400 first)
    ],
)
def test_admission(
    running: int, reserved: int, need: int, max_running: int, capacity: int, admit: bool
) -> None:
    assert (
        can_admit(
            running=running,
            reserved_tokens=reserved,
            need=need,
            max_running=max_running,
            kv_capacity=capacity,
        )
        is admit
    )


def test_kv_usage_counts_prompt_and_tokens_generated_so_far() -> None:
    timing = Timing(first_token_s=0.0, token_interval_s=1.0, tokens=10)
    jobs = [Job(100, timing, started_at=0.0), Job(50, timing, started_at=5.0)]
    assert kv_usage(jobs, 5.0, 1000) == pytest.approx((100 + 6 + 50 + 1) / 1000)
    assert kv_usage(jobs, 100.0, 1000) == pytest.approx((110 + 60) / 1000)
    assert kv_usage(jobs, 5.0, 0) == 0.0
    assert kv_usage([Job(100, timing)], 5.0, 1000) == 0.0  # waiting calls hold no cache


async def test_waiting_calls_start_in_arrival_order_and_a_large_head_is_not_overtaken() -> None:
    clock = [0.0]
    engine = Engine(max_running=0, kv_capacity=100, clock=lambda: clock[0])
    timing = Timing(first_token_s=0, token_interval_s=0, tokens=0)
    first, big, small = Job(60, timing), Job(70, timing), Job(10, timing)
    await engine.start(first)
    big_started = asyncio.create_task(engine.start(big))
    small_started = asyncio.create_task(engine.start(small))
    await wait_until(lambda: engine.waiting == 2)
    assert engine.waiting == 2 and not big_started.done() and not small_started.done()
    assert "running=1 waiting=2" in repr(engine)
    engine.finish(first)
    await asyncio.wait_for(big_started, 1)
    await asyncio.wait_for(small_started, 1)
    assert engine.running == {big, small} and engine.waiting == 0


async def test_a_waiting_call_that_leaves_lets_the_next_one_run() -> None:
    engine = Engine(max_running=0, kv_capacity=100, clock=lambda: 0.0)
    timing = Timing(first_token_s=0, token_interval_s=0, tokens=0)
    await engine.start(Job(60, timing))
    big = asyncio.create_task(engine.start(Job(70, timing)))
    small_job = Job(30, timing)
    small = asyncio.create_task(engine.start(small_job))
    await wait_until(lambda: engine.waiting == 2)
    big.cancel()
    await asyncio.wait_for(small, 1)  # the head left: the small call fits beside the first
    assert small_job in engine.running and engine.waiting == 0
