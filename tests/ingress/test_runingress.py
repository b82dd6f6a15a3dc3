"""``manage.py runingress`` as a real process (uvicorn, uvloop, httptools) beside the stack's daphne.

The real openai SDK calls it plainly and streaming; a client gone mid-stream cancels the backend call
as it does through daphne; SIGTERM withdraws the process's producer at once; a bad command line is a
CommandError before anything binds.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest
from django.core.management import CommandError, call_command

from runtime.valkey.embedded import free_port
from tests.support.ingress_stack import Stack
from tests.support.streaming import assert_a_client_gone_mid_stream_cancels_the_call
from tests.support.waiting import port_open, wait_until_sync

HELLO = [{"role": "user", "content": "Hello"}]


@dataclass
class Ingress:
    url: str
    proc: subprocess.Popen[bytes]


def start_ingress(stack: Stack, name: str) -> Ingress:
    port = free_port()
    argv = [sys.executable, "manage.py", "runingress", "--host", "127.0.0.1", "--port", str(port)]
    proc = stack.start(argv, name)
    wait_until_sync(lambda: port_open(port) or proc.poll() is not None, 30, what=f"{name} up")
    assert proc.poll() is None, (stack.root / f"{name}.log").read_text()
    return Ingress(f"http://127.0.0.1:{port}/v1", proc)


@pytest.fixture(scope="module")
def ingress(stack: Stack) -> Iterator[Ingress]:
    running = start_ingress(stack, "runingress")
    yield running
    running.proc.terminate()
    running.proc.wait(15)


@pytest.mark.slow
def test_a_plain_completion_through_runingress(ingress: Ingress, alice_key: str) -> None:
    api = openai.OpenAI(base_url=ingress.url, api_key=alice_key)
    raw = api.chat.completions.with_raw_response.create(model="sim-model", messages=HELLO)  # type: ignore[arg-type]
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    assert len(raw.headers["x-dispatch-request-id"]) == 32
    assert float(raw.headers["x-dispatch-queue-wait-ms"]) >= 0
    assert "server" not in raw.headers
    assert [m.id for m in api.models.list().data] == ["sim-model"]


@pytest.mark.slow
async def test_a_stream_through_runingress(ingress: Ingress, alice_key: str) -> None:
    async with openai.AsyncOpenAI(base_url=ingress.url, api_key=alice_key) as api:
        events = await api.chat.completions.create(
            model="m", messages=HELLO, stream=True, stream_options={"include_usage": True},  # type: ignore[arg-type]
            max_tokens=6, extra_body={"sim": {"completion_tokens": 6, "itl_ms": 20}},
            extra_headers={"X-Dispatch-Pool": "iron"},
        )  # fmt: skip
        chunks = [chunk async for chunk in events]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


@pytest.mark.slow
async def test_a_client_gone_mid_stream_cancels_the_backend_call(
    stack: Stack, ingress: Ingress, alice_key: str
) -> None:
    await assert_a_client_gone_mid_stream_cancels_the_call(stack, ingress.url, alice_key)


@pytest.mark.slow
def test_sigterm_withdraws_the_producer_at_once(stack: Stack, alice_key: str) -> None:
    ingress = start_ingress(stack, "runingress-stopped")
    api = openai.OpenAI(base_url=ingress.url, api_key=alice_key)
    assert api.chat.completions.create(model="m", messages=HELLO).choices  # type: ignore[arg-type]
    alive = stack.keys.producer_alive(f"ingress-{socket.gethostname()}-{ingress.proc.pid}")
    with stack.valkey() as valkey:
        assert valkey.exists(alive)
        ingress.proc.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal once it has shut down (a clean stop for systemd).
        assert ingress.proc.wait(15) in (0, -signal.SIGTERM)
        # Deleted by the lifespan shutdown, not left to lapse with its TTL.
        assert not valkey.exists(alive)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--port", "0"], "--port must be between 1 and 65535"),
        (["--port", "70000"], "--port must be between 1 and 65535"),
        (["--workers", "0"], "--workers must be at least 1"),
        (["--host", "no-such-host.invalid"], "unknown host"),
    ],
)
def test_a_bad_command_line_is_a_command_error(options: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("runingress", *options)


def test_a_taken_port_is_a_command_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"cannot serve on 127.0.0.1:{port}"):
            call_command("runingress", "--port", str(port))
