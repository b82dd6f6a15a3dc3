"""``/v1/embeddings``, ``/v1/completions`` and model aliases with the real openai SDK (sync and async),
against real daphne, dispatcher and simulator processes: through the queue, streamed where the API
streams, and refused in OpenAI's error shape without naming any internal address."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.ingress_stack import GROUP, Stack
from tests.support.waiting import wait_until_sync

pytestmark = pytest.mark.slow
LLAMA = "meta-llama/Llama-3-8B-Instruct"
ALIASES = """
from pools import services
from pools.models import FabricGroup, ModelAlias, Pool
group = FabricGroup.objects.get(group_id={group!r})
ModelAlias.objects.create(group=group, alias="batch/llama-3-8b", pool=Pool.objects.get(pool_id="iron"),
                          backend_model={llama!r})
ModelAlias.objects.create(group=group, alias="gold/embed", pool=Pool.objects.get(pool_id="gold"))
assert services.group_publish(group=group).ok
"""


def client(stack: Stack, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def aliases(stack: Stack, alice_key: str) -> Iterator[None]:
    """The two aliases, published, and seen by the web process's producer (it reads the registry on a
    short refresh): waited for through ``GET /v1/models``, as a client would find them."""
    stack.manage("shell", "-c", ALIASES.format(group=GROUP, llama=LLAMA))
    api = client(stack, alice_key)
    wait_until_sync(
        lambda: "batch/llama-3-8b" in {m.id for m in api.models.list().data}, 20, what="aliases listed"
    )
    yield


@pytest.fixture(scope="module")
def iron_key(stack: Stack) -> str:
    """Allowed into iron only, with no default pool: every request names a pool or an alias."""
    return stack.create_key("iron-aliases", "iron", "--no-default-pool")


def test_embeddings_sync_through_the_queue(stack: Stack, alice_key: str) -> None:
    before = stack.sim_count("/v1/embeddings")
    raw = client(stack, alice_key).embeddings.with_raw_response.create(
        model="sim-embed", input=["first page", "second page"], dimensions=16
    )  # the SDK asks for base64 and decodes it
    answer = raw.parse()
    assert [len(d.embedding) for d in answer.data] == [16, 16]
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > 0
    assert (
        len(raw.headers["x-dispatch-request-id"]) == 32
        and float(raw.headers["x-dispatch-queue-wait-ms"]) >= 0
    )
    assert stack.sim_count("/v1/embeddings") == before + 1


async def test_embeddings_async_as_floats(stack: Stack, alice_key: str) -> None:
    async with openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=alice_key, max_retries=0) as api:
        answer = await api.embeddings.create(
            model="sim-embed",
            input="one text",
            encoding_format="float",
            extra_headers={"X-Dispatch-Pool": "iron"},
        )
    assert len(answer.data) == 1 and len(answer.data[0].embedding) == 256  # the simulator's default size


def test_legacy_completions_plain_and_streamed_sync(stack: Stack, alice_key: str) -> None:
    api = client(stack, alice_key)
    plain = api.completions.create(model="sim-model", prompt="Write a line", max_tokens=4)
    assert plain.object == "text_completion" and len(plain.choices[0].text) == 16
    assert plain.usage is not None and plain.usage.completion_tokens == 4
    chunks = list(api.completions.create(model="sim-model", prompt="Write a line", max_tokens=4, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert all(c.usage is None for c in chunks)  # not asked for


async def test_legacy_completions_streamed_async_with_usage(stack: Stack, alice_key: str) -> None:
    async with openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=alice_key, max_retries=0) as api:
        stream = await api.completions.create(
            model="sim-model", prompt="Go", max_tokens=3, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
        plain = await api.completions.create(model="sim-model", prompt="Go", max_tokens=3)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text


def test_an_alias_routes_without_headers_and_names_the_backend_model(
    stack: Stack, iron_key: str, aliases: None
) -> None:
    api = client(stack, iron_key)  # iron only, no default pool: only the alias can route these
    chat = api.chat.completions.create(model="batch/llama-3-8b", messages=[{"role": "user", "content": "hi"}])
    assert chat.model == LLAMA  # the simulator names the model it was sent
    text = api.completions.create(model="batch/llama-3-8b", prompt="hi", max_tokens=2)
    assert text.model == LLAMA
    assert api.embeddings.create(model="batch/llama-3-8b", input="hi").model == LLAMA


def test_models_lists_what_the_key_may_use(
    stack: Stack, iron_key: str, alice_key: str, aliases: None
) -> None:
    assert [m.id for m in client(stack, iron_key).models.list().data] == ["batch/llama-3-8b"]
    listed = [m.id for m in client(stack, alice_key).models.list().data]
    assert listed == ["sim-model", "batch/llama-3-8b", "gold/embed"]  # the backend's, then the aliases


def assert_public(error: openai.APIStatusError, stack: Stack) -> None:
    """An OpenAI-shaped error that names no internal address."""
    body = error.response.json()
    assert set(body["error"]) >= {"message", "type", "code", "param"}
    shown = error.response.text
    assert "127.0.0.1" not in shown and stack.sim_url not in shown and "redis://" not in shown


@pytest.mark.parametrize(
    ("model", "headers", "status", "code"),
    [
        ("batch/llama-3-8b", {"X-Dispatch-Pool": "gold"}, 400, "model_pool_conflict"),
        ("no-such-alias", {}, 400, "model_not_routed"),
        ("gold/embed", {}, 403, "pool_not_allowed"),  # an alias of a pool the key may not use
    ],
)
def test_routing_refusals(
    stack: Stack, iron_key: str, aliases: None, model: str, headers: dict[str, str], status: int, code: str
) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client(stack, iron_key).embeddings.create(model=model, input="x", extra_headers=headers)
    assert caught.value.status_code == status and caught.value.code == code
    assert_public(caught.value, stack)


def test_an_alias_with_its_own_pool_header_is_fine(stack: Stack, iron_key: str, aliases: None) -> None:
    api = client(stack, iron_key)
    assert api.embeddings.create(
        model="batch/llama-3-8b", input="x", extra_headers={"X-Dispatch-Pool": "iron"}
    )


@pytest.mark.parametrize(
    ("dimensions", "says", "param"),
    [
        (0, "dimensions must be between 1 and 65536, got 0", "dimensions"),  # refused by the ingress
        (5000, "'dimensions' must be an integer between 1 and 3072, got 5000", None),  # by the backend
    ],
)
def test_a_bad_dimension_is_a_bad_request(
    stack: Stack, alice_key: str, dimensions: int, says: str, param: str | None
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(stack, alice_key).embeddings.create(model="sim-embed", input="x", dimensions=dimensions)
    error = caught.value.response.json()["error"]
    assert error["message"] == says and caught.value.param == param
    assert_public(caught.value, stack)


def test_embeddings_do_not_stream_and_completions_need_a_prompt(stack: Stack, alice_key: str) -> None:
    auth = {"authorization": f"Bearer {alice_key}"}
    streamed = httpx.post(
        f"{stack.url}/v1/embeddings", headers=auth, json={"model": "m", "input": "x", "stream": True}
    )
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "stream"
    with pytest.raises(openai.BadRequestError) as caught:
        client(stack, alice_key).completions.create(model="sim-model", prompt=None)  # type: ignore[arg-type]
    error = caught.value.response.json()["error"]
    assert error["message"] == "prompt is required" and caught.value.param == "prompt"
