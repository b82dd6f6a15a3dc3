"""vLLM-like behaviour over real HTTP: running/waiting, KV cache, faults; /metrics read as Prometheus text."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from simulator.behaviour import Behaviour
from simulator.engine import Timing
from simulator.openai_format import estimate_prompt
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.waiting import wait_until

TEXT = "x" * 400  # 4 + 400 / 4 = 104 prompt tokens
MESSAGES = [{"role": "user", "content": TEXT}]
PROMPT_TOKENS = estimate_prompt(MESSAGES)[0]


def chat(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": MESSAGES, **extra}


async def scrape(c: httpx.AsyncClient, sim: SimulatorServer) -> dict[str, float]:
    """Every sample of /metrics by name (labels dropped; each gauge here has one sample)."""
    response = await c.get(sim.url.removesuffix("/v1") + "/metrics")
    assert response.status_code == 200
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=50)) as c:
        yield c


async def gauges_reach(c: httpx.AsyncClient, sim: SimulatorServer, **expected: float) -> dict[str, float]:
    """Scrapes until the named samples hold the expected values; returns that scrape."""
    seen: dict[str, float] = {}

    async def check() -> bool:
        seen.update(await scrape(c, sim))
        return all(seen.get(name) == value for name, value in expected.items())

    try:
        await wait_until(check, timeout=10, interval=0.02)
    except AssertionError:
        raise AssertionError(f"metrics never reached {expected}: {seen}") from None
    return seen


async def test_six_slow_calls_with_max_running_four(http: httpx.AsyncClient) -> None:
    async with SimulatorServer(SimulatorConfig(max_running=4)) as sim:
        calls = [
            asyncio.create_task(http.post(sim.url + "/chat/completions", json=chat(sim={"latency_ms": 600})))
            for _ in range(6)
        ]
        values = await gauges_reach(http, sim, **{"vllm:num_requests_waiting": 2})
        assert values["vllm:num_requests_running"] == 4
        assert values["vllm:kv_cache_usage_perc"] == 0  # unlimited cache
        responses = await asyncio.gather(*calls)
        assert [r.status_code for r in responses] == [200] * 6
        values = await scrape(http, sim)
        assert values["vllm:num_requests_running"] == 0
        assert values["vllm:num_requests_waiting"] == 0
        assert values["vllm:generation_tokens_total"] == 6 * 16


async def test_kv_cache_usage_grows_with_generated_tokens_and_empties_after(http: httpx.AsyncClient) -> None:
    config = SimulatorConfig(kv_cache_tokens=1000, itl_ms=100, default_completion_tokens=10)
    async with SimulatorServer(config) as sim:
        call = asyncio.create_task(http.post(sim.url + "/chat/completions", json=chat()))
        first = (await gauges_reach(http, sim, **{"vllm:num_requests_running": 1}))[
            "vllm:kv_cache_usage_perc"
        ]
        assert (PROMPT_TOKENS + 1) / 1000 <= first <= (PROMPT_TOKENS + 4) / 1000
        # 10 tokens over 0.9 s: the cache holds the prompt plus what has been generated so far.
        later = await wait_until(lambda: sim.kv_usage() >= (PROMPT_TOKENS + 6) / 1000 and sim.kv_usage())
        assert later <= (PROMPT_TOKENS + 10) / 1000
        values = await scrape(http, sim)
        assert values["vllm:kv_cache_usage_perc"] >= later
        assert (await call).status_code == 200
        assert (await scrape(http, sim))["vllm:kv_cache_usage_perc"] == 0


async def test_a_full_kv_cache_makes_calls_wait_and_an_oversized_call_is_refused(
    http: httpx.AsyncClient,
) -> None:
    # Each call reserves its prompt (104) and completion (196): 300 tokens; 700 hold two of them.
    config = SimulatorConfig(kv_cache_tokens=700, default_completion_tokens=196)
    async with SimulatorServer(config) as sim:
        slow = chat(sim={"latency_ms": 500})
        calls = [asyncio.create_task(http.post(sim.url + "/chat/completions", json=slow)) for _ in range(3)]
        values = await gauges_reach(http, sim, **{"vllm:num_requests_waiting": 1})
        assert values["vllm:num_requests_running"] == 2
        assert values["vllm:kv_cache_usage_perc"] == pytest.approx(2 * PROMPT_TOKENS / 700)
        assert [r.status_code for r in await asyncio.gather(*calls)] == [200] * 3

        refused = await http.post(sim.url + "/chat/completions", json=chat(sim={"completion_tokens": 600}))
        assert refused.status_code == 400
        assert "the cache holds 700" in refused.json()["error"]["message"]


async def test_rate_limited_calls_get_429_with_retry_after_at_once(http: httpx.AsyncClient) -> None:
    config = SimulatorConfig(rate_limit_rate=0.5, retry_after_s=7, latency_ms=300, seed=5)
    async with SimulatorServer(config) as sim:
        started = time.perf_counter()
        refused = []
        for _ in range(20):
            response = await http.post(sim.url + "/chat/completions", json=chat(sim={"latency_ms": 0}))
            if response.status_code == 429:
                refused.append(response)
            else:
                assert response.status_code == 200
        assert 3 <= len(refused) <= 17
        for response in refused:
            assert response.headers["Retry-After"] == "7"
            assert response.json()["error"]["type"] == "rate_limit_error"
        assert sim.errors_by_status == {429: len(refused)}
        values = await scrape(http, sim)
        assert values["sim_errors_total"] == len(refused)
        assert time.perf_counter() - started < 5


async def test_a_hanging_call_holds_its_slot_until_the_client_leaves(http: httpx.AsyncClient) -> None:
    async with SimulatorServer(SimulatorConfig(hang_rate=1.0, max_running=1)) as sim:
        with pytest.raises(httpx.ReadTimeout):
            async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=0.5)) as impatient:
                hung = asyncio.create_task(impatient.post(sim.url + "/chat/completions", json=chat()))
                values = await gauges_reach(http, sim, **{"vllm:num_requests_running": 1})
                assert values["vllm:num_requests_waiting"] == 0
                await hung
        # The client closed its connection: the call is aborted and its slot freed, as vLLM aborts.
        await gauges_reach(http, sim, **{"vllm:num_requests_running": 0})
        assert sim.completions_total == 0


async def test_a_waiting_client_that_leaves_is_dropped_from_the_queue(http: httpx.AsyncClient) -> None:
    async with SimulatorServer(SimulatorConfig(max_running=1)) as sim:
        running = asyncio.create_task(
            http.post(sim.url + "/chat/completions", json=chat(sim={"latency_ms": 1500}))
        )
        await wait_until(lambda: sim.running == 1)
        with pytest.raises(httpx.ReadTimeout):
            async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=0.4)) as impatient:
                left = asyncio.create_task(impatient.post(sim.url + "/chat/completions", json=chat()))
                await gauges_reach(http, sim, **{"vllm:num_requests_waiting": 1})
                await left
        await gauges_reach(http, sim, **{"vllm:num_requests_waiting": 0, "vllm:num_requests_running": 1})
        assert (await running).status_code == 200
        assert sim.completions_total == 1


async def test_latency_jitter_holds_each_call_for_at_least_its_drawn_latency(http: httpx.AsyncClient) -> None:
    """The server waits out the latency its seeded draw gave each call (the draws' spread around the
    median is tested without a server, in tests/simulator/test_behaviour.py). Only a lower bound holds
    over HTTP: on a busy machine the HTTP round trip adds any amount to each call."""
    config = SimulatorConfig(latency_ms=100, latency_sigma=0.5, seed=11)
    twin = Behaviour(config, random.Random(config.seed))  # draws what the server draws, in the same order
    drawn = sorted(twin.plan(chat(), {}).latency_s for _ in range(30))
    assert drawn[0] < 0.05 and drawn[-1] > 0.35  # seed 11 draws 41 ms .. 362 ms: a real spread
    async with SimulatorServer(config) as sim:

        async def timed() -> float:
            started = time.perf_counter()
            assert (await http.post(sim.url + "/chat/completions", json=chat())).status_code == 200
            return time.perf_counter() - started

        latencies = sorted(await asyncio.gather(*(timed() for _ in range(30))))
    # Each call lasts at least its own draw, so the k-th shortest call lasts at least the k-th draw.
    pairs = list(zip(latencies, drawn, strict=True))
    assert all(seen >= due for seen, due in pairs), pairs


async def test_sglang_kind_exposes_sglang_names(http: httpx.AsyncClient) -> None:
    config = SimulatorConfig(kind="sglang", max_running=1, kv_cache_tokens=1000)
    async with SimulatorServer(config) as sim:
        calls = [
            asyncio.create_task(http.post(sim.url + "/chat/completions", json=chat(sim={"latency_ms": 400})))
            for _ in range(2)
        ]
        values = await gauges_reach(http, sim, **{"sglang:num_queue_reqs": 1})
        assert values["sglang:num_running_reqs"] == 1
        assert values["sglang:token_usage"] == pytest.approx(PROMPT_TOKENS / 1000)
        assert not any(name.startswith("vllm:") for name in values)
        await asyncio.gather(*calls)
        values = await scrape(http, sim)
        assert (values["sglang:num_running_reqs"], values["sglang:num_queue_reqs"]) == (0, 0)
        assert values["sglang:token_usage"] == 0


async def test_metrics_text_is_valid_prometheus_with_one_registry_per_server() -> None:
    async with (
        SimulatorServer(SimulatorConfig(model="a")) as one,
        SimulatorServer(SimulatorConfig(model="b")) as two,
    ):
        for sim in (one, two):
            families = {f.name: f for f in text_string_to_metric_families(sim.metrics_text())}
            assert families["vllm:num_requests_running"].type == "gauge"
            assert families["vllm:num_requests_running"].samples[0].labels == {"model_name": sim.config.model}
            assert families["vllm:prompt_tokens"].type == "counter"
    assert orjson.loads(orjson.dumps({"ok": True}))  # both exposed side by side without a registry clash


async def test_kv_usage_follows_the_tokens_a_stream_has_delivered(http: httpx.AsyncClient) -> None:
    config = SimulatorConfig(kv_cache_tokens=1000, itl_ms=150, default_completion_tokens=6)
    # The most a call can have generated by a given time after its request was sent: it starts
    # running after that, and its first token comes no sooner than its start.
    earliest = Timing(first_token_s=0.0, token_interval_s=0.150, tokens=6)
    async with SimulatorServer(config) as sim:
        seen = []
        body = chat(stream=True)
        sent = time.monotonic()
        async with http.stream("POST", sim.url + "/chat/completions", json=body) as response:
            delivered = 0
            async for line in response.aiter_lines():
                if not line or line == "data: [DONE]":
                    continue
                delta = orjson.loads(line.removeprefix("data: "))["choices"][0]["delta"]
                delivered += bool(delta.get("content"))
                if delivered:
                    held = round((await scrape(http, sim))["vllm:kv_cache_usage_perc"] * 1000)
                    most = earliest.generated(time.monotonic() - sent)
                    seen.append((delivered, held - PROMPT_TOKENS, most))
        # After k tokens reached the client the cache holds the prompt and at least those k tokens, and
        # no more than can have been generated by the time the scrape came back: k, or k + 1 if the
        # next one is generated while the scrape travels (more only if this process was held up, as on
        # a busy machine, while the stream went on); the last token ends the call and frees it all.
        assert [delivered for delivered, _, _ in seen[:6]] == [1, 2, 3, 4, 5, 6]
        for delivered, generated, most in seen[:5]:
            assert delivered <= generated <= most, seen
        assert (await scrape(http, sim))["vllm:kv_cache_usage_perc"] == 0
