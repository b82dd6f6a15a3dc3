"""The simulator over real HTTP: shape, metrics, errors, the ``sim`` hook, keep-alive, concurrency."""

from __future__ import annotations

import asyncio
import sys
import time

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from simulator.__main__ import main
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.waiting import wait_until

MESSAGES = [{"role": "user", "content": "Hello there, simulator!"}]


def chat(**extra: object) -> dict[str, object]:
    return {"model": "test-model", "messages": MESSAGES, **extra}


def metric_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


@pytest.fixture
async def sim():
    async with SimulatorServer(SimulatorConfig(model="sim-x", seed=7)) as server:
        yield server


@pytest.fixture
async def client(sim: SimulatorServer):
    async with httpx.AsyncClient(base_url=sim.url, timeout=10) as c:
        yield c


async def test_completion_shape_and_usage(sim: SimulatorServer, client: httpx.AsyncClient) -> None:
    response = await client.post("/chat/completions", json=chat())
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert isinstance(body["created"], int)
    assert body["model"] == "test-model"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert "Hello there" in choice["message"]["content"]
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] == 16
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert sim.completions_total == 1
    assert sim.requests_by_path["/v1/chat/completions"] == 1


async def test_max_tokens_caps_completion(client: httpx.AsyncClient) -> None:
    body = (await client.post("/chat/completions", json=chat(max_tokens=3))).json()
    assert body["usage"]["completion_tokens"] == 3
    assert body["choices"][0]["finish_reason"] == "length"
    body = (await client.post("/chat/completions", json={"messages": MESSAGES})).json()
    assert body["model"] == "sim-x"


async def test_models_and_health(sim: SimulatorServer, client: httpx.AsyncClient) -> None:
    models = (await client.get("/models")).json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["sim-x"]
    health = await client.get(sim.url.removesuffix("/v1") + "/health")
    assert health.status_code == 200
    assert health.json() == {"status": "ok"}
    assert sim.requests_total == 2


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/nope", None, 404),
        ("GET", "/v1/chat/completions", None, 405),
        ("POST", "/v1/chat/completions", b"not json", 400),
        ("POST", "/v1/chat/completions", b"[]", 400),
        ("POST", "/v1/chat/completions", orjson.dumps({"messages": []}), 400),
        ("POST", "/v1/chat/completions", orjson.dumps(chat(stream=True, stream_options=[1])), 400),
        ("POST", "/v1/chat/completions", orjson.dumps(chat(stream="yes")), 400),
        ("POST", "/v1/chat/completions", orjson.dumps(chat(stream_options={"include_usage": True})), 400),
        ("POST", "/v1/chat/completions", orjson.dumps(chat(sim={"bogus": 1})), 400),
        ("POST", "/v1/chat/completions", orjson.dumps(chat(sim={"status": "x"})), 400),
        ("POST", "/v1/chat/completions", orjson.dumps(chat(sim={"retry_after": -1})), 400),
    ],
)
async def test_bad_requests_get_openai_error_bodies(
    client: httpx.AsyncClient, method: str, path: str, body: bytes | None, status: int
) -> None:
    response = await client.request(method, str(client.base_url).removesuffix("/v1/") + path, content=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert error["message"]


async def test_chunked_request_body_refused(sim: SimulatorServer) -> None:
    async def chunks():
        yield orjson.dumps(chat())

    async with httpx.AsyncClient() as c:
        response = await c.post(sim.url + "/chat/completions", content=chunks())
    assert response.status_code == 411
    assert "chunked" in response.json()["error"]["message"]


async def test_metrics_show_running_and_waiting() -> None:
    config = SimulatorConfig(model="m1", max_running=1)
    async with SimulatorServer(config) as sim, httpx.AsyncClient(base_url=sim.url, timeout=10) as c:
        slow = chat(sim={"latency_ms": 400})
        calls = [asyncio.create_task(c.post("/chat/completions", json=slow)) for _ in range(2)]
        await wait_until(lambda: sim.running == 1 and sim.waiting == 1)
        metrics = await c.get(sim.url.removesuffix("/v1") + "/metrics")
        assert metrics.headers["content-type"].startswith("text/plain")
        values = metric_values(metrics.text)
        label = (("model_name", "m1"),)
        assert values[("vllm:num_requests_running", label)] == 1
        assert values[("vllm:num_requests_waiting", label)] == 1
        assert "running=1 waiting=1" in repr(sim)
        responses = await asyncio.gather(*calls)
        assert [r.status_code for r in responses] == [200, 200]
        values = metric_values((await c.get(sim.url.removesuffix("/v1") + "/metrics")).text)
        assert values[("vllm:num_requests_running", label)] == 0
        assert values[("vllm:num_requests_waiting", label)] == 0
        assert values[("sim_requests_total", (("path", "/v1/chat/completions"),))] == 2
        assert values[("sim_completions_total", label)] == 2
        assert "served=2" in repr(sim)


async def test_error_rate_uses_configured_statuses() -> None:
    config = SimulatorConfig(error_rate=1.0, error_statuses=(429, 503), seed=1)
    async with SimulatorServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as c:
        responses = [await c.post("/chat/completions", json=chat()) for _ in range(30)]
        statuses = {r.status_code for r in responses}
        assert statuses == {429, 503}
        for response in responses:
            assert response.json()["error"]["message"].startswith("simulated error")
        assert sim.errors_total == 30
        assert sim.completions_total == 0
        values = metric_values((await c.get(sim.url.removesuffix("/v1") + "/metrics")).text)
        assert sum(v for (name, _), v in values.items() if name == "sim_errors_total") == 30


async def test_sim_hook_status_and_message(client: httpx.AsyncClient) -> None:
    response = await client.post("/chat/completions", json=chat(sim={"status": 500, "message": "boom"}))
    assert response.status_code == 500
    assert response.json()["error"] == {
        "message": "boom",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }


@pytest.mark.parametrize(
    ("hook", "retry_after"),
    [
        ({"status": 503, "retry_after": 7}, "7"),  # any injected error may carry one
        ({"status": 429}, "1"),  # a 429 carries the configured one
        ({"status": 503}, None),
    ],
)
async def test_sim_hook_retry_after(
    client: httpx.AsyncClient, hook: dict[str, int], retry_after: str | None
) -> None:
    response = await client.post("/chat/completions", json=chat(sim=hook))
    assert response.status_code == hook["status"]
    assert response.headers.get("retry-after") == retry_after


async def test_sim_hook_latency(client: httpx.AsyncClient) -> None:
    started = time.perf_counter()
    response = await client.post("/chat/completions", json=chat(sim={"latency_ms": 150}))
    assert response.status_code == 200
    assert time.perf_counter() - started >= 0.14


async def test_sim_hook_invalid_body(client: httpx.AsyncClient) -> None:
    response = await client.post("/chat/completions", json=chat(sim={"invalid_body": True}))
    assert response.status_code == 200
    with pytest.raises(ValueError):
        response.json()


async def test_token_speed_adds_generation_time() -> None:
    config = SimulatorConfig(tokens_per_second=100, default_completion_tokens=20)
    async with SimulatorServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as c:
        started = time.perf_counter()
        body = (await c.post("/chat/completions", json=chat())).json()
        assert time.perf_counter() - started >= 0.19
        assert body["usage"]["completion_tokens"] == 20


async def test_keep_alive_many_requests_on_one_connection(sim: SimulatorServer) -> None:
    body = orjson.dumps(chat())
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body
    reader, writer = await asyncio.open_connection("127.0.0.1", sim.port)
    try:
        for _ in range(300):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            assert orjson.loads(await reader.readexactly(length))["usage"]["total_tokens"] > 0
        writer.write(b"GET /health HTTP/1.1\r\nHost: sim\r\nConnection: close\r\n\r\n")
        response = await reader.read()
        assert b"Connection: close" in response
        assert response.endswith(b'{"status":"ok"}')
    finally:
        writer.close()
    assert sim.completions_total == 300


async def test_few_hundred_concurrent_requests() -> None:
    # httpcore's pool costs O(waiting x connections) per event, so a few hundred requests share 32
    # connections here; the raw-socket test below covers hundreds of simultaneous connections.
    config = SimulatorConfig(latency_ms=20, latency_sigma=0.3, max_running=64, seed=3)
    limits = httpx.Limits(max_connections=32)
    async with SimulatorServer(config) as sim, httpx.AsyncClient(base_url=sim.url, limits=limits) as c:
        responses = await asyncio.gather(*(c.post("/chat/completions", json=chat()) for _ in range(300)))
        assert all(r.status_code == 200 for r in responses)
        assert sim.completions_total == 300
        assert sim.running == 0
        assert sim.waiting == 0


async def test_hundreds_of_simultaneous_connections() -> None:
    config = SimulatorConfig(latency_ms=50, max_running=100)
    body = orjson.dumps(chat())
    request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )

    async def one_connection() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", sim.port)
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            return int(head.split(b" ")[1])
        finally:
            writer.close()

    async with SimulatorServer(config) as sim:
        statuses = await asyncio.gather(*(one_connection() for _ in range(400)))
        assert statuses == [200] * 400
        assert sim.completions_total == 400
        assert sim.running == 0
        assert sim.waiting == 0


async def test_stop_with_request_in_flight_and_counts_without_calls() -> None:
    sim = SimulatorServer(SimulatorConfig())
    assert "not started" in repr(sim)
    await sim.start()
    assert sim.requests_total == 0
    async with httpx.AsyncClient(base_url=sim.url) as c:
        task = asyncio.create_task(c.post("/chat/completions", json=chat(sim={"latency_ms": 5000})))
        await wait_until(lambda: sim.running == 1)
        await asyncio.wait_for(sim.stop(), 2)
        with pytest.raises(httpx.TransportError):
            await task


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="error_rate") as info:
        SimulatorConfig(error_rate=2, max_running=-1)
    assert "max_running" in str(info.value)
    with pytest.raises(ValueError, match="error_statuses"):
        SimulatorConfig(error_statuses=(200,))


def test_main_rejects_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--error-rate", "5"])
    assert info.value.code == 2
    assert "error_rate must be between 0 and 1" in capsys.readouterr().err


async def test_main_process_runs_until_sigterm(unused_tcp_port: int) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "simulator",
        "--port",
        str(unused_tcp_port),
        "--latency-ms",
        "1",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        line = await asyncio.wait_for(process.stdout.readline(), 10)
        assert f"127.0.0.1:{unused_tcp_port}/v1".encode() in line
        async with httpx.AsyncClient() as c:
            response = await c.get(f"http://127.0.0.1:{unused_tcp_port}/health")
        assert response.status_code == 200
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 10) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
