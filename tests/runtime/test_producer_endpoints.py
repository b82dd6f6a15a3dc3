"""Embeddings and legacy completions through the producer: a real dispatcher over a real Valkey and the
simulator over HTTP (and the direct path: conftest's ``producer`` runs on both); the answers validate
as the openai SDK's own types, and the dispatcher's spans name the operation (OpenTelemetry GenAI
``gen_ai.operation.name``)."""

from __future__ import annotations

import base64
import struct
import subprocess
import sys

import pytest
import redis.asyncio as aioredis
from openai.types import Completion, CreateEmbeddingResponse
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runtime.backends.adapter import OpenAIBackend
from runtime.errors import BackendHTTPError, MalformedEnvelope
from runtime.producer import Producer, SyncProducer
from runtime.queue.keys import KeySpace
from runtime.telemetry import semconv
from runtime.valkey.embedded import free_port
from runtime.wire.contract import EmbeddingsCall
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from simulator.server import SimulatorServer
from tests.support.dispatching import one_pool_group, running_dispatcher, wait_until
from tests.support.durable import group as durable_group
from tests.support.waiting import port_open, wait_until_sync

EMBED = {"model": "sim-embed", "input": ["first document", "second document"], "dimensions": 12}
TEXT = {"model": "sim-model", "prompt": "Once upon a time", "max_tokens": 6}


async def test_embed_returns_what_the_sdk_validates(producer: Producer, sim: SimulatorServer) -> None:
    result = await producer.embed(EMBED, pool_id="default", timeout=30)
    answer = CreateEmbeddingResponse.model_validate(result.completion)
    assert [len(d.embedding) for d in answer.data] == [12, 12]
    assert answer.data[0].embedding != answer.data[1].embedding
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > 0
    assert sim.requests_by_path["/v1/embeddings"] == 1 and sim.completions_requested == 0


async def test_base64_embeddings_are_the_same_vectors_as_floats(producer: Producer) -> None:
    floats = await producer.embed({**EMBED, "encoding_format": "float"}, pool_id="default")
    packed = await producer.embed({**EMBED, "encoding_format": "base64"}, pool_id="default")
    raw = base64.b64decode(packed.completion["data"][1]["embedding"])
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert decoded == pytest.approx(floats.completion["data"][1]["embedding"], abs=1e-6)


async def test_complete_returns_a_text_completion(producer: Producer) -> None:
    result = await producer.complete(TEXT, pool_id="default", timeout=30)
    completion = Completion.model_validate(result.completion)
    assert completion.object == "text_completion" and completion.choices[0].text
    assert completion.usage is not None and completion.usage.completion_tokens == 6


async def test_stream_completion_yields_text_completion_chunks(producer: Producer) -> None:
    params = {**TEXT, "stream": True, "stream_options": {"include_usage": True}}
    chunks = [c async for c in producer.stream_completion(params, pool_id="default")]
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert len("".join(c["choices"][0]["text"] for c in chunks if c["choices"])) == 6 * 4
    # OpenAI's chunks carry finish_reason null until the last one, which the SDK's type (it builds
    # stream chunks unvalidated) refuses: the finishing and the usage chunks validate.
    finished = [
        Completion.model_validate(c) for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]
    ]
    assert [f.choices[0].finish_reason for f in finished] == ["length"]
    usage = Completion.model_validate(chunks[-1]).usage
    assert usage is not None and usage.completion_tokens == 6


async def test_an_embeddings_call_does_not_stream(producer: Producer) -> None:
    with pytest.raises(MalformedEnvelope, match="does not stream"):
        producer.stream(EmbeddingsCall.from_openai(EMBED), pool_id="default")  # type: ignore[arg-type]


async def test_the_backends_refusal_of_a_dimension_reaches_the_caller(producer: Producer) -> None:
    with pytest.raises(BackendHTTPError) as caught:
        await producer.embed({**EMBED, "dimensions": 5000}, pool_id="default")
    assert caught.value.status_code == 400 and "between 1 and 3072" in (caught.value.backend_message or "")


async def test_dispatcher_spans_name_the_operation(
    aredis: aioredis.Redis,
    keys: KeySpace,
    sim: SimulatorServer,
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    async with (
        running_dispatcher(aredis, keys, one_pool_group(sim.url), tracer=provider.get_tracer("t")),
        Producer(aredis, keys=keys) as producer,
    ):
        await producer.embed(EMBED, pool_id="default", request_id="r-embed")
        await producer.complete(TEXT, pool_id="default", request_id="r-text")
        stream = producer.stream_completion({**TEXT, "stream": True}, pool_id="default", request_id="r-flow")
        assert [c async for c in stream]
        await producer.submit(
            {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]},
            pool_id="default",
            request_id="r-chat",
        )
    dispatched = {
        s.attributes[semconv.REQUEST_ID]: s
        for s in exporter.get_finished_spans()
        if s.attributes and s.attributes.get(semconv.SPAN_KIND_ROLE) == "dispatcher"
    }
    operations = {rid: s.attributes[semconv.GEN_AI_OPERATION_NAME] for rid, s in dispatched.items()}  # type: ignore[index]
    assert operations == {
        "r-embed": "embeddings", "r-text": "text_completion", "r-flow": "text_completion", "r-chat": "chat",
    }  # fmt: skip
    assert dispatched["r-embed"].name == "embeddings sim-embed"
    embed = dispatched["r-embed"].attributes or {}
    assert embed[semconv.MESSAGE_COUNT] == 2  # two inputs
    assert embed[semconv.GEN_AI_USAGE_INPUT_TOKENS] > 0 and embed[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 0


def test_the_sync_producer_twins(valkey_url: str, keys: KeySpace) -> None:
    """SyncProducer.embed / complete on the direct path to a simulator process (a sync test: the
    simulator cannot share the test's thread)."""
    port = free_port()
    sim = subprocess.Popen(
        [sys.executable, "-m", "simulator", "--port", str(port)], stdout=subprocess.DEVNULL
    )
    try:
        wait_until_sync(lambda: port_open(port), 20, what="simulator up")
        backend = OpenAIBackend(f"http://127.0.0.1:{port}/v1")
        with SyncProducer(valkey_url, keys=keys, direct_backend=backend) as sync:
            embedded = sync.embed(EMBED, pool_id="default")
            completed = sync.complete(TEXT, pool_id="default")
    finally:
        sim.terminate()
        sim.wait(10)
    assert len(CreateEmbeddingResponse.model_validate(embedded.completion).data) == 2
    assert Completion.model_validate(completed.completion).choices[0].text


async def test_an_embedding_costs_its_pool_its_input_tokens_only(
    aredis: aioredis.Redis, keys: KeySpace, sim: SimulatorServer
) -> None:
    """In a pool fair in tokens, an embedding's charge is its input tokens times the input weight: no
    output estimate (the pool's default 256 at weight 4 would dwarf it), and the usage correction
    reads an embeddings answer's usage (prompt tokens only) as zero output."""
    pool = PoolConfig("docs", max_concurrent=2, tenant_fairness="tokens", tenant_input_weight=2.0)
    config = GroupConfig("embed", policy="drr", total_concurrency=2, default_endpoint_url=sim.url, version=1,
                         pools=(pool,))  # fmt: skip
    async with (
        running_dispatcher(aredis, keys, config) as dispatcher,
        Producer(aredis, keys=keys) as producer,
    ):
        done = await producer.embed(EMBED, pool_id="docs", tenant="team-a")
        await wait_until(lambda: not dispatcher.queue.charges, timeout=10, what="the charge corrected")
    prompt_tokens = done.completion["usage"]["prompt_tokens"]
    served = float(await aredis.hget(keys.tenant_served("docs"), "team-a") or 0)
    assert served == pytest.approx(2.0 * prompt_tokens) and prompt_tokens > 0


async def test_durable_delivery_serves_both_endpoints(
    aredis: aioredis.Redis, keys: KeySpace, sim: SimulatorServer
) -> None:
    """In a durable group the claim stores the envelope (endpoint included) with its lease and chunks
    are fenced: an embeddings call and a streamed legacy completion come back whole."""
    async with (
        running_dispatcher(aredis, keys, durable_group(sim.url)),
        Producer(aredis, keys=keys) as producer,
    ):
        embedded = await producer.embed(EMBED, pool_id="default", timeout=30)
        chunks = [c async for c in producer.stream_completion({**TEXT, "stream": True}, pool_id="default")]
    assert len(CreateEmbeddingResponse.model_validate(embedded.completion).data) == 2
    assert len("".join(c["choices"][0]["text"] for c in chunks if c["choices"])) == 6 * 4
