"""LiteLLM in place of a backend: a group whose backend is a real LiteLLM proxy (in front of the
simulator), called by a real dispatcher; plain, streamed, and LiteLLM's errors as our typed errors.

LiteLLM runs from ``var/litellm-venv`` (``bench/litellm_proxy.py``; never a project dependency, ~750 MB
and minutes to install): these tests skip, saying how to install it, when it is not there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from bench._common import simulator_proc
from bench.litellm_proxy import MASTER_KEY, litellm_binary, litellm_proxy, openai_model
from runtime.errors import BackendHTTPError
from runtime.producer import Producer
from runtime.queue.keys import KeySpace
from tests.support.dispatching import CALL, one_pool_group, running_dispatcher

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def litellm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """LiteLLM's /v1 URL, its ``sim-model`` routed to a simulator process."""
    binary, why = litellm_binary(install=False)
    if binary is None:
        pytest.skip(why)
    with (
        simulator_proc() as sim_url,
        litellm_proxy(binary, [openai_model("sim-model", sim_url, "sk-sim")],
                      Path(tmp_path_factory.mktemp("litellm"))) as (url, _),
    ):  # fmt: skip
        yield url


@pytest.fixture
async def producer(aredis: aioredis.Redis, keys: KeySpace, litellm: str) -> AsyncIterator[Producer]:
    # The group's backend is LiteLLM; its key (the proxy's master key) comes from the named variable.
    config = replace(one_pool_group(litellm), api_key_env="LITELLM_KEY")
    async with (
        running_dispatcher(aredis, keys, config, secrets={"LITELLM_KEY": MASTER_KEY}),
        Producer(aredis, keys=keys) as running,
    ):
        yield running


async def test_a_plain_call_through_litellm_as_the_backend(producer: Producer) -> None:
    result = await producer.submit(CALL, pool_id="default", timeout=60)
    completion = ChatCompletion.model_validate(result.completion)
    assert completion.choices[0].message.content and completion.usage is not None


async def test_a_streamed_call_through_litellm_as_the_backend(producer: Producer) -> None:
    stream = producer.stream({**CALL, "max_tokens": 4}, pool_id="default", include_usage=True, timeout=60)
    chunks = [ChatCompletionChunk.model_validate(c) async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


async def test_litellm_s_error_becomes_our_typed_backend_error(producer: Producer) -> None:
    """The simulator refuses the call (400); LiteLLM passes the status on; the producer gets ours."""
    call = {**CALL, "sim": {"status": 400, "message": "the prompt is too long for this model"}}
    with pytest.raises(BackendHTTPError) as caught:
        await producer.submit(call, pool_id="default", timeout=60)
    assert caught.value.error_type == "backend_http_error"
    assert "HTTP 400" in str(caught.value) and "the prompt is too long for this model" in str(caught.value)
