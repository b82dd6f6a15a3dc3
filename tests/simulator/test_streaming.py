"""Streaming from the simulator with the real ``openai`` SDK over HTTP: chunks spread over time, usage."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.waiting import wait_until

MESSAGES = [{"role": "user", "content": "Stream me a story"}]


@pytest.fixture
async def sim():
    async with SimulatorServer(SimulatorConfig(model="sim-s", ttft_ms=40, itl_ms=30)) as server:
        yield server


@pytest.fixture
async def client(sim: SimulatorServer):
    async with openai.AsyncOpenAI(base_url=sim.url, api_key="unused", max_retries=0) as c:
        yield c


async def test_chunks_arrive_spread_over_time_and_concatenate_to_the_full_text(
    sim: SimulatorServer, client: openai.AsyncOpenAI
) -> None:
    full = await client.chat.completions.create(
        model="m", messages=MESSAGES, extra_body={"sim": {"itl_ms": 0}}
    )
    expected = full.choices[0].message.content

    started = time.perf_counter()
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    arrivals, chunks = [], []
    async for chunk in stream:
        arrivals.append(time.perf_counter() - started)
        chunks.append(chunk)

    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1 and chunks[0].model == "m"
    content = [c.choices[0].delta.content or "" for c in chunks]
    assert "".join(content) == expected
    assert "Stream me a story" in expected
    assert sum(1 for part in content if part) == 16  # one delta per token
    assert [c.choices[0].finish_reason for c in chunks][-1] == "stop"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert all(c.usage is None for c in chunks)  # not asked for
    # 40 ms to the first token, then 15 gaps of 30 ms: the first chunk comes well before the last.
    assert arrivals[-1] >= 0.04 + 15 * 0.03
    assert arrivals[-1] - arrivals[0] >= 0.3
    assert sim.completions_total == 2


async def test_include_usage_adds_a_last_chunk_with_usage_and_no_choices(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=5,
        extra_body={"sim": {"itl_ms": 1, "ttft_ms": 0}},
    )
    chunks = [chunk async for chunk in stream]
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == 5
    assert last.usage.prompt_tokens > 0
    assert last.usage.total_tokens == last.usage.prompt_tokens + 5
    assert chunks[-2].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == "Simulated reply to: "[:20]


async def test_sim_hook_sets_time_to_first_token(client: openai.AsyncOpenAI) -> None:
    started = time.perf_counter()
    stream = await client.chat.completions.create(
        model="m", messages=MESSAGES, stream=True, extra_body={"sim": {"ttft_ms": 300, "itl_ms": 0}}
    )
    first_at = None
    async for _ in stream:
        first_at = first_at or time.perf_counter() - started
    assert first_at is not None and first_at >= 0.29


async def test_raw_events_are_openai_sse(sim: SimulatorServer) -> None:
    body = {"model": "m", "messages": MESSAGES, "stream": True, "sim": {"completion_tokens": 2}}
    async with (
        httpx.AsyncClient() as c,
        c.stream("POST", sim.url + "/chat/completions", json=body) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line async for line in response.aiter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    assert len(lines) == 1 + 2 + 1 + 1  # role, two tokens, finish, [DONE]


async def test_an_injected_error_answers_before_any_stream(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.RateLimitError) as info:
        await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, extra_body={"sim": {"status": 429}}
        )
    assert info.value.response.headers["retry-after"] == "1"


async def test_a_client_leaving_mid_stream_frees_its_running_slot(
    sim: SimulatorServer, client: openai.AsyncOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    stream = await client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        stream=True,
        extra_body={"sim": {"itl_ms": 200, "completion_tokens": 50}},
    )
    async for chunk in stream:
        assert chunk.choices[0].delta.role == "assistant"
        break
    assert sim.running == 1
    await stream.close()
    await wait_until(lambda: sim.running == 0, timeout=5)
    assert sim.completions_total == 0
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
