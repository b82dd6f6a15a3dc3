"""A real LiteLLM proxy in front of the ingress: a team's existing LiteLLM points an ``openai/``
deployment at LLM Dispatch, and its clients (the real openai SDK, default settings) keep talking to
LiteLLM, plain and streamed.

LiteLLM runs from ``var/litellm-venv`` (``bench/litellm_proxy.py``; never a project dependency, ~750 MB
and minutes to install): these tests skip, saying how to install it, when it is not there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import orjson
import pytest

from bench.litellm_proxy import MASTER_KEY, litellm_binary, litellm_proxy, openai_model
from tests.support.ingress_stack import GROUP, Stack
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def proxy(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """LiteLLM's /v1 URL: ``sim-model`` goes to the key's default pool, ``sim-iron`` to pool iron."""
    binary, why = litellm_binary(install=False)
    if binary is None:
        pytest.skip(why)
    key = stack.create_key("litellm", "gold,iron")
    ingress = f"{stack.url}/v1"
    models = [
        openai_model("sim-model", ingress, key),
        # The pool header rides on the deployment: LiteLLM sends it with every call to that model.
        openai_model("sim-iron", ingress, key, extra_headers={"X-Dispatch-Pool": "iron"}),
        openai_model("sim-solo", ingress, key, extra_headers={"X-Dispatch-Pool": "solo"}),  # not allowed
        openai_model("sim-revoked", ingress, "ldk-not-a-key"),
    ]
    with litellm_proxy(binary, models, Path(tmp_path_factory.mktemp("litellm"))) as (url, _):
        yield url


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=MASTER_KEY)


def test_a_plain_completion_through_litellm_and_the_queue(stack: Stack, proxy: str) -> None:
    before = stack.sim_count()
    raw = client(proxy).chat.completions.with_raw_response.create(model="sim-model", messages=HELLO)  # type: ignore[arg-type]
    completion = raw.parse()
    assert completion.choices[0].message.content
    # LiteLLM passes our response headers on under its own prefix: the call went through the ingress.
    assert len(raw.headers["llm_provider-x-dispatch-request-id"]) == 32
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    assert stack.sim_count() == before + 1


def test_a_streamed_completion_through_litellm(proxy: str) -> None:
    chunks = list(
        client(proxy).chat.completions.create(
            model="sim-model",
            messages=HELLO,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) > 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "stop"
    ]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def dispatchers_hold(stack: Stack, pool_id: str) -> bool:
    """Every dispatcher of the group has applied the pause of ``pool_id`` (its latest snapshot says so)."""
    with stack.valkey() as client:
        snapshots = [client.get(key) for key in client.keys(stack.keys.snapshot_pattern(GROUP))]
    pools = [p for raw in snapshots if raw for p in orjson.loads(raw)["pools"] if p["pool_id"] == pool_id]
    return bool(pools) and all(p["paused"] for p in pools)


async def test_a_deployment_s_pool_header_queues_its_calls_in_that_pool(stack: Stack, proxy: str) -> None:
    """Paused, pool iron keeps the call LiteLLM sent in its list; resumed, the call completes."""
    stack.set_paused(True, "iron")
    try:
        await wait_until(lambda: dispatchers_hold(stack, "iron"), 10, interval=0.1, what="the pause applied")
        async with openai.AsyncOpenAI(base_url=proxy, api_key=MASTER_KEY) as api:
            call = asyncio.create_task(api.chat.completions.create(model="sim-iron", messages=HELLO))  # type: ignore[arg-type]
            await wait_until(
                lambda: stack.queued("iron") == 1, 30, interval=0.1, what="the call queued in pool iron"
            )
            assert not call.done()
            stack.set_paused(False, "iron")
            completion = await asyncio.wait_for(call, 60)
    finally:
        stack.set_paused(False, "iron")
    assert completion.choices[0].message.content


@pytest.mark.parametrize(
    ("model", "error", "message"),
    [
        ("sim-solo", openai.PermissionDeniedError, "key 'litellm' may not use pool 'solo'"),
        ("sim-revoked", openai.AuthenticationError, "invalid or revoked API key"),
    ],
)
def test_our_refusals_reach_the_client_through_litellm_with_their_status(
    proxy: str, model: str, error: type[openai.APIStatusError], message: str
) -> None:
    with pytest.raises(error) as caught:
        client(proxy).chat.completions.create(model=model, messages=HELLO)  # type: ignore[arg-type]
    assert message in caught.value.message
