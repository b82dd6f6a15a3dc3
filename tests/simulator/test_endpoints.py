"""The simulator's ``/v1/embeddings`` and ``/v1/completions``, read by the real openai SDK over HTTP."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import openai
import pytest

from simulator import endpoints_format as endpoints
from simulator.server import SimulatorServer


@pytest.fixture
async def api() -> AsyncIterator[tuple[SimulatorServer, openai.AsyncOpenAI]]:
    async with SimulatorServer() as sim:
        client = openai.AsyncOpenAI(base_url=sim.url, api_key="k", max_retries=0)
        yield sim, client
        await client.close()


async def test_embeddings_have_the_requested_dimensions_and_are_unit_vectors(
    api: tuple[SimulatorServer, openai.AsyncOpenAI],
) -> None:
    sim, client = api
    # Left out, the SDK asks for base64 and decodes it itself: both shapes are exercised.
    for encoding in (openai.NOT_GIVEN, "float"):
        answer = await client.embeddings.create(
            model="emb", input=["a cat", "a dog", "a cat"], dimensions=7, encoding_format=encoding
        )
        vectors = [d.embedding for d in answer.data]
        assert [len(v) for v in vectors] == [7, 7, 7] and [d.index for d in answer.data] == [0, 1, 2]
        assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-5) for v in vectors)
        assert vectors[0] == vectors[2] != vectors[1]  # deterministic per input
        assert vectors[1] == pytest.approx(endpoints.vector("emb", "a dog", 7), abs=1e-6)
        assert answer.usage.prompt_tokens == answer.usage.total_tokens == 3  # "a cat" = 1, ...
    default = await client.embeddings.create(model="emb", input=[1, 2, 3])
    assert len(default.data) == 1 and len(default.data[0].embedding) == endpoints.DEFAULT_DIMENSIONS
    assert default.usage.prompt_tokens == 3
    assert sim.requests_by_path["/v1/embeddings"] == 3


@pytest.mark.parametrize(
    ("params", "says"),
    [
        (
            {"input": "x", "dimensions": endpoints.MAX_DIMENSIONS + 1},
            "'dimensions' must be an integer between",
        ),
        ({"input": "x", "dimensions": 0}, "'dimensions' must be an integer between"),
        ({"input": ""}, "'input' must not contain empty strings"),
        ({"input": []}, "'input' must be a string or a non-empty list"),
    ],
)
async def test_bad_embeddings_requests_are_refused_as_openai_does(
    api: tuple[SimulatorServer, openai.AsyncOpenAI], params: dict[str, object], says: str
) -> None:
    _, client = api
    with pytest.raises(openai.BadRequestError) as caught:
        await client.embeddings.create(model="emb", encoding_format="float", **params)  # type: ignore[arg-type]
    assert says in caught.value.message


async def test_a_legacy_completion_plain_and_streamed(
    api: tuple[SimulatorServer, openai.AsyncOpenAI],
) -> None:
    _, client = api
    plain = await client.completions.create(model="m", prompt="Tell me", max_tokens=3)
    assert plain.object == "text_completion" and plain.choices[0].finish_reason == "length"
    assert len(plain.choices[0].text) == 12 and plain.usage is not None and plain.usage.completion_tokens == 3
    stream = await client.completions.create(
        model="m", prompt="Tell me", max_tokens=3, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == plain.usage.total_tokens


async def test_a_completion_with_a_null_prompt_is_refused(
    api: tuple[SimulatorServer, openai.AsyncOpenAI],
) -> None:
    _, client = api
    with pytest.raises(openai.BadRequestError, match="'prompt' must be a string"):
        await client.completions.create(model="m", prompt=None)  # type: ignore[arg-type]


def test_vectors_depend_on_the_model_the_input_and_the_size_only() -> None:
    one = endpoints.vector("m", "text", 16)
    assert one == endpoints.vector("m", "text", 16)
    assert one != endpoints.vector("other", "text", 16) and one != endpoints.vector("m", "text!", 16)
    assert endpoints.vector("m", [1, 2], 3) != endpoints.vector("m", [2, 1], 3)
