"""Issue 24: the backend page's "Test connection" reads /v1/models and the metrics once, over real HTTP,
and shows what it read: against simulator processes of each kind, and against hostile servers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
from aiohttp import web
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from pools.models import Backend
from runtime.valkey.embedded import free_port
from runtime.wire.backendconfig import KINDS
from simulator.config import KINDS as SIMULATOR_KINDS
from tests.support.loop_thread import loop_thread
from tests.support.waiting import port_open, wait_until_sync

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.django_db


def page(backend: Backend) -> str:
    return f"/admin/pools/backend/{backend.pk}/test-connection/"


def shown(client: Client, backend: Backend) -> str:
    """The result page, its whitespace folded (the template wraps lines)."""
    response = client.post(page(backend))
    assert response.status_code == 200
    return " ".join(response.content.decode().split())


@contextlib.contextmanager
def simulator(kind: str) -> Iterator[str]:
    """A simulator process exporting ``kind``'s metric names; yields its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator", "--port", str(port), "--kind", kind, "--model", "m-1"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_until_sync(lambda: port_open(port), timeout=20)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(
    ("kind", "gauges", "load"),
    [
        ("vllm", ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"],
         "Load: running 0, waiting 0, KV-cache usage 0% (<code>vllm:kv_cache_usage_perc</code>)."),
        ("sglang", ["sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"],
         "Load: running 0, waiting 0, KV-cache usage 0% (<code>sglang:token_usage</code>)."),
        ("llamacpp", ["llamacpp:requests_processing", "llamacpp:requests_deferred",
                      "llamacpp:kv_cache_usage_ratio"],
         "Load: running 0, waiting 0, KV-cache usage 0% (<code>llamacpp:kv_cache_usage_ratio</code>)."),
        ("tgi", ["tgi_batch_current_size", "tgi_queue_size"],
         "Load: running 0, waiting 0, no KV-cache gauge (gated on the request gauges alone)."),
    ],
)  # fmt: skip
def test_it_shows_the_models_the_gauges_read_and_the_load(
    superuser_client: Client, kind: str, gauges: list[str], load: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIM_KEY", "sk-test")
    with simulator(kind) as url:
        backend = Backend.objects.create(backend_id="sim", base_url=url, kind=kind, api_key_env="SIM_KEY")
        text = shown(superuser_client, backend)
    assert '<p id="models-found">1 model found:</p> <ul id="models"><li><code>m-1</code></li></ul>' in text
    assert "with the key from <code>SIM_KEY</code>" in text
    assert "Gauges read: " + ", ".join(f"<code>{g}</code>" for g in gauges) in text
    assert load in text
    assert "errornote" not in text


def test_a_plain_openai_server_shows_its_models_and_no_metrics(superuser_client: Client) -> None:
    with simulator("openai") as url:
        backend = Backend.objects.create(backend_id="ollama", base_url=url, kind="openai", load_gating=False)
        text = shown(superuser_client, backend)
    assert "1 model found" in text and "without a key" in text
    assert 'id="metrics-none"' in text and "a 429's Retry-After holds its pools" in text


def test_the_wrong_kind_says_which_gauges_are_missing(superuser_client: Client) -> None:
    with simulator("tgi") as url:
        backend = Backend.objects.create(backend_id="sim", base_url=url, kind="llamacpp")
        text = shown(superuser_client, backend)
    assert "Gauges read: none" in text
    assert (
        "Metrics refused: the metrics lack llamacpp:requests_processing, llamacpp:requests_deferred "
        "(is the backend kind &#x27;llamacpp&#x27; right?)"
    ) in text


def test_a_backend_that_is_down_is_unreachable_not_an_error_page(superuser_client: Client) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    backend = Backend.objects.create(backend_id="down", base_url=url, kind="vllm", api_key_env="NOT_SET_X")
    text = shown(superuser_client, backend)
    assert "Models not read: ConnectError" in text and "Metrics unreachable: ConnectError" in text
    assert "<code>NOT_SET_X</code> is not set in this process's environment" in text


# --- hostile backends: a real aiohttp server in a thread, answering as badly as it can ----------------
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.contextmanager
def hostile(models: Handler, metrics: Handler) -> Iterator[str]:
    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, handler_cancellation=True)
    port = free_port()
    with loop_thread() as thread:
        thread.run(runner.setup())
        thread.run(web.TCPSite(runner, "127.0.0.1", port).start())
        try:
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            thread.run(runner.cleanup(), 10)


async def drip(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    for _ in range(600):  # a byte every 50 ms: 30 s, far beyond any budget
        await response.write(b"#")
        await asyncio.sleep(0.05)  # the scenario: a server that trickles its body
    return response


async def huge(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    for _ in range(64):  # 64 MiB, never sent whole
        await response.write(b"x" * (1 << 20))
    return response


async def not_json(request: web.Request) -> web.Response:
    return web.Response(text="<html>login required</html>")


async def no_data(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "models": "everything"})


async def unauthorized(request: web.Request) -> web.Response:
    return web.json_response({"error": "bad key"}, status=401)


async def nan_metrics(request: web.Request) -> web.Response:
    return web.Response(text="tgi_queue_size NaN\ntgi_batch_current_size 1\n")


@pytest.mark.parametrize(
    ("models", "metrics", "models_words", "metrics_words"),
    [
        (drip, drip, "Models not read: no whole answer within 1s (models timeout)",
         "Metrics unreachable: no whole answer within 1s (metrics timeout)"),
        (huge, huge, "Models not read: the models body is over the cap (1048576 bytes)",
         "Metrics refused: the metrics body is over the cap (1048576 bytes)"),
        (not_json, nan_metrics, "Models not read: the models answer is not JSON (27 bytes)",
         "Metrics refused: tgi_queue_size is nan (not a finite number)"),
        (no_data, unauthorized, "Models not read: the models answer has no &quot;data&quot; list",
         "Metrics unreachable: HTTPStatusError: Client error &#x27;401 Unauthorized&#x27;"),
    ],
)  # fmt: skip
def test_a_hostile_backend_gets_a_bounded_look_and_the_reason(
    superuser_client: Client, models: Handler, metrics: Handler, models_words: str, metrics_words: str
) -> None:
    with hostile(models, metrics) as url:
        backend = Backend.objects.create(
            backend_id="evil", base_url=url, kind="tgi", timeout_s=1, metrics_timeout_s=1
        )
        started = time.monotonic()
        text = shown(superuser_client, backend)
        took = time.monotonic() - started
    assert models_words in text and metrics_words in text
    assert took < 10  # two budgets of 1 s, with room for a loaded machine


def test_the_button_is_on_the_change_page_and_a_get_only_goes_back(superuser_client: Client) -> None:
    backend = Backend.objects.create(backend_id="sim", base_url="http://127.0.0.1:9/v1")
    change = superuser_client.get(f"/admin/pools/backend/{backend.pk}/change/").content.decode()
    assert 'id="test-connection"' in change and f'action="{page(backend)}"' in change
    assert 'id="test-connection"' not in superuser_client.get("/admin/pools/backend/add/").content.decode()
    response = superuser_client.get(page(backend))  # no call out on a GET (a link, a prefetch)
    assert response.status_code == 302 and response["Location"].endswith(f"/{backend.pk}/change/")


def test_only_who_may_change_the_backend_may_test_it(db: None) -> None:
    backend = Backend.objects.create(backend_id="sim", base_url="http://127.0.0.1:9/v1")
    viewer = get_user_model().objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_backend"))
    client = Client()
    client.force_login(viewer)
    assert client.post(page(backend)).status_code == 403


def test_the_admin_offers_every_kind_the_runtime_knows() -> None:
    assert tuple(Backend.Kind.values) == KINDS == SIMULATOR_KINDS
