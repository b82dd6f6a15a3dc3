"""A durable group's stream through the ingress whose dispatcher is SIGKILLed mid-stream: the openai SDK
gets the first attempt's chunks once, then a typed ``stream_interrupted`` error; nothing is run again.
openai SDK -> daphne -> Valkey -> dispatcher process (killed) -> streaming simulator."""

from __future__ import annotations

import signal
import subprocess

import openai
import pytest

from tests.support.dispatcher_process import start_dispatcher, stop_dispatcher
from tests.support.ingress_stack import Stack
from tests.support.waiting import wait_until_sync

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
SETUP = """
from pools import services
from pools.models import Backend, FabricGroup, Pool
group = FabricGroup.objects.create(group_id="dur", policy="fifo", total_concurrency=4, delivery="durable",
                                   backend=Backend.objects.get(backend_id="ing-sim"))
Pool.objects.create(group=group, pool_id="dpool", max_concurrent=4)
assert services.group_publish(group=group).ok
"""


def test_a_dispatcher_killed_mid_stream_ends_the_sse_stream_with_stream_interrupted(stack: Stack) -> None:
    stack.manage("shell", "-c", SETUP)
    key = stack.create_key("durable-client", "dpool")
    procs: list[subprocess.Popen[str]] = []

    def dispatcher(ident: str) -> subprocess.Popen[str]:
        procs.append(
            start_dispatcher(stack.valkey_url, stack.keys.prefix, "dur", ident, concurrency=4, lease_s=2)
        )
        return procs[-1]

    doomed = dispatcher("doomed")
    api = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0)
    contents: list[str] = []
    roles = 0
    try:
        with (
            pytest.raises(openai.APIError) as caught,
            api.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Hello"}], stream=True,
                extra_headers={"X-Dispatch-Pool": "dpool"},
                extra_body={"sim": {"completion_tokens": 60, "itl_ms": 150}},  # ~9 s of tokens
            ) as events,
        ):  # fmt: skip
            for chunk in events:
                roles += sum(1 for c in chunk.choices if c.delta.role)
                contents.extend(c.delta.content or "" for c in chunk.choices)
                if len(contents) == 3:
                    doomed.send_signal(signal.SIGKILL)
                    doomed.wait(5)
                    dispatcher("survivor")
        assert caught.value.body["code"] == "stream_interrupted"  # type: ignore[index]
        assert "doomed" not in caught.value.message  # no internal name reaches the API client
        assert roles == 1 and len(contents) >= 3  # the first attempt's chunks, once, nothing of a second
        with stack.valkey() as valkey:
            wait_until_sync(
                lambda: int(valkey.hget(stack.keys.counters("dur"), "failed:stream_interrupted") or 0) == 1,
                10,
                what="the interruption counted",
            )
            assert int(valkey.hget(stack.keys.counters("dur"), "requeued") or 0) == 0
            assert valkey.llen(stack.keys.requests("dpool")) == 0
    finally:
        for proc in procs:
            stop_dispatcher(proc)
