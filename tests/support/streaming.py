"""Streamed calls through the ingress, as the SDK makes them: shared by the daphne and runingress tests."""

from __future__ import annotations

import openai

from tests.support.ingress_stack import Stack
from tests.support.waiting import wait_until

HELLO = [{"role": "user", "content": "Hello"}]


def paced(tokens: int, itl_ms: int, ttft_ms: int = 0) -> dict[str, object]:
    """The simulator's per-call pacing (``extra_body``): how many tokens, how far apart."""
    return {"sim": {"completion_tokens": tokens, "itl_ms": itl_ms, "ttft_ms": ttft_ms}}


async def assert_a_client_gone_mid_stream_cancels_the_call(stack: Stack, base_url: str, key: str) -> None:
    """Through the ingress at ``base_url`` (daphne's or runingress's)."""
    cancelled_before = stack.counter("failed:cancelled")
    async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0) as api:
        events = await api.chat.completions.create(
            model="m", messages=HELLO, stream=True, max_tokens=400, extra_body=paced(400, 50),  # type: ignore[arg-type]
            extra_headers={"X-Dispatch-Pool": "solo"},
        )  # fmt: skip
        async for _ in events:
            break
        await events.close()
    # 400 tokens 50 ms apart would take 20 s: the call is cut off long before.
    await wait_until(lambda: stack.counter("failed:cancelled") == cancelled_before + 1, 5, what="cancelled")
    with stack.valkey() as valkey:
        assert valkey.zcard(stack.keys.pool_inflight("solo")) == 0
