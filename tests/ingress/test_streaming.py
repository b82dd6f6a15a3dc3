"""``stream: true`` end to end: openai SDK -> daphne -> Valkey -> dispatcher -> streaming simulator."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time

import openai
import pytest

from runtime.producer import Producer
from runtime.valkey.client import connect
from tests.support.ingress_stack import ROOT, Stack
from tests.support.streaming import HELLO, assert_a_client_gone_mid_stream_cancels_the_call, paced
from tests.support.waiting import wait_until_sync

pytestmark = pytest.mark.slow


def test_chunks_arrive_before_the_call_ends(stack: Stack, alice_key: str) -> None:
    api = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=alice_key, max_retries=0)
    started = time.monotonic()
    arrivals: list[float] = []
    text: list[str] = []
    with api.chat.completions.create(
        model="m",
        messages=HELLO,
        stream=True,
        max_tokens=20,
        extra_body=paced(20, 50),  # type: ignore[arg-type]
    ) as events:
        for chunk in events:
            arrivals.append(time.monotonic() - started)
            text.extend(c.delta.content or "" for c in chunk.choices)
            assert chunk.usage is None  # not asked for
    ended = time.monotonic() - started
    assert len(arrivals) >= 20 and "".join(text)
    # 20 tokens 50 ms apart: the first chunk comes about a second before the call ends.
    assert ended - arrivals[0] > 0.6, f"first chunk at {arrivals[0]:.3f}s, end at {ended:.3f}s"


async def test_the_async_client_gets_usage_when_it_asks(stack: Stack, alice_key: str) -> None:
    async with openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=alice_key, max_retries=0) as api:
        raw = await api.chat.completions.with_raw_response.create(
            model="m", messages=HELLO, stream=True, stream_options={"include_usage": True},  # type: ignore[arg-type]
            max_tokens=5, extra_headers={"X-Dispatch-Pool": "iron"},
        )  # fmt: skip
        assert raw.headers["content-type"] == "text/event-stream"
        assert len(raw.headers["x-dispatch-request-id"]) == 32
        chunks = [chunk async for chunk in raw.parse()]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    assert not chunks[-1].choices
    assert chunks[-2].choices[0].finish_reason == "length"


async def test_an_error_before_the_first_chunk_is_a_status_code(stack: Stack, alice_key: str) -> None:
    async with openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=alice_key, max_retries=0) as api:
        with pytest.raises(openai.InternalServerError) as caught:
            await api.chat.completions.create(
                model="m",
                messages=HELLO,
                stream=True,
                extra_headers={"X-Dispatch-Pool": "noend"},  # type: ignore[arg-type]
            )
    assert caught.value.status_code == 503


async def test_a_client_gone_mid_stream_cancels_the_backend_call(stack: Stack, alice_key: str) -> None:
    await assert_a_client_gone_mid_stream_cancels_the_call(stack, f"{stack.url}/v1", alice_key)


async def test_the_python_client_streams_too(stack: Stack) -> None:
    async with Producer(connect(stack.valkey_url), keys=stack.keys) as producer:
        stream = producer.stream(
            {"model": "m", "messages": HELLO, "max_tokens": 8, **paced(8, 20)},
            pool_id="gold",
            include_usage=True,
        )
        chunks = [chunk async for chunk in stream]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert chunks[-1]["usage"]["completion_tokens"] == 8
    assert stream.queue_wait_s is not None and stream.timing is not None


def test_a_producer_killed_mid_stream_cancels_the_backend_call(stack: Stack) -> None:
    gone_before = stack.counter("failed:stream_producer_gone")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.stream_process",
            stack.valkey_url,
            stack.keys.prefix,
            "solo",
            "1",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"chunk\n"
        proc.kill()
        proc.wait(5)
        # Its liveness key lapses within a second; the next chunk's relay finds it gone (the stream
        # would last 40 s otherwise).
        wait_until_sync(
            lambda: stack.counter("failed:stream_producer_gone") == gone_before + 1, 8, what="producer gone"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with stack.valkey() as valkey:
        assert valkey.zcard(stack.keys.pool_inflight("solo")) == 0


async def test_many_concurrent_streams(stack: Stack, alice_key: str) -> None:
    async with openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=alice_key, max_retries=0) as api:

        async def one(i: int) -> str:
            events = await api.chat.completions.create(
                model="m", messages=[{"role": "user", "content": str(i)}], stream=True, max_tokens=6,  # type: ignore[arg-type]
                extra_body=paced(6, 5), extra_headers={"X-Dispatch-Pool": "iron"},
            )  # fmt: skip
            return "".join([c.choices[0].delta.content or "" async for c in events if c.choices])

        texts = await asyncio.gather(*(one(i) for i in range(12)))
    assert all(texts)
