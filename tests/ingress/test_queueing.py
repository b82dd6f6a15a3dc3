"""Ingress traffic keeps the queue's guarantees: disconnects cancel, DRR fairness holds across keys."""

from __future__ import annotations

import asyncio
import contextlib

import openai
import pytest

from tests.support.ingress_stack import Stack
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def ask(text: str, latency_ms: int) -> dict[str, object]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": text}],
        "extra_body": {"sim": {"latency_ms": latency_ms}},
    }


def api(stack: Stack, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0, timeout=30)


async def test_a_client_gone_while_queued_cancels_its_request(stack: Stack, alice_key: str) -> None:
    solo = {"X-Dispatch-Pool": "solo"}  # one slot: the second call waits in the queue
    before, cancelled_before = stack.sim_count(), stack.counter("dropped:cancelled")
    async with api(stack, alice_key) as client:
        blocker = asyncio.create_task(
            client.chat.completions.create(**ask("first", 1500), extra_headers=solo)
        )
        await wait_until(lambda: stack.sim_count() == before + 1, 10, what="the first call at the backend")
        queued = asyncio.create_task(client.chat.completions.create(**ask("queued", 1), extra_headers=solo))
        await wait_until(lambda: stack.queued("solo") == 1, 10, what="the second call queued")
        queued.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await queued
        await wait_until(
            lambda: stack.queued("solo") == 0, 5, what="the cancelled call taken out of the queue"
        )
        assert stack.counter("dropped:cancelled") == cancelled_before + 1
        assert (await blocker).choices
        # FIFO within the pool: had the cancelled call stayed, it would reach the backend before this one.
        assert (await client.chat.completions.create(**ask("after", 1), extra_headers=solo)).choices
    assert stack.sim_count() == before + 2


async def test_a_client_gone_while_running_cancels_the_backend_call(stack: Stack, alice_key: str) -> None:
    solo = {"X-Dispatch-Pool": "solo"}
    cancelled_before = stack.counter("failed:cancelled")
    async with api(stack, alice_key) as client:
        running = asyncio.create_task(
            client.chat.completions.create(**ask("long", 20_000), extra_headers=solo)
        )
        await wait_until(lambda: stack.sim_running() == 1, 10, what="the call running at the backend")
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        # Well before the backend's 20 s: the dispatcher cut the call off and freed the pool's slot.
        await wait_until(
            lambda: stack.counter("failed:cancelled") == cancelled_before + 1,
            5,
            what="the call counted cancelled",
        )
        with stack.valkey() as valkey:
            assert valkey.zcard(stack.keys.pool_inflight("solo")) == 0
        solo_call = await client.chat.completions.create(**ask("next", 1), extra_headers=solo)
        assert solo_call.choices


async def test_drr_weights_hold_for_two_keys_on_two_pools(stack: Stack) -> None:
    gold_key = stack.create_key("fair-gold", "gold")
    iron_key = stack.create_key("fair-iron", "iron")
    per_key = 40
    finished: list[str] = []

    async def call(client: openai.AsyncOpenAI, pool: str, i: int) -> None:
        await client.chat.completions.create(**ask(f"{pool} {i}", 30))
        finished.append(pool)

    stack.set_paused(True, "gold", "iron")  # both backlogged before the dispatcher may take any
    async with api(stack, gold_key) as gold, api(stack, iron_key) as iron:
        calls = [asyncio.create_task(call(gold, "gold", i)) for i in range(per_key)]
        calls += [asyncio.create_task(call(iron, "iron", i)) for i in range(per_key)]
        await wait_until(
            lambda: stack.queued("gold") == per_key and stack.queued("iron") == per_key,
            20,
            what="both backlogs",
        )
        stack.set_paused(False, "gold", "iron")
        await asyncio.gather(*calls)
    # While both pools have backlog (the first 40 completions: gold has 40 calls, 30 of them by then),
    # weight 3:1 gives gold three calls for each of iron's.
    window = finished[:40]
    ratio = window.count("gold") / max(1, window.count("iron"))
    assert 2.2 <= ratio <= 4.2, f"gold:iron was {ratio:.2f} in {window}"
