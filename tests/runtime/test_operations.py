"""The embeddings and legacy completions calls of the wire contract: what each accepts and refuses, how an
envelope names its endpoint (old envelopes decode unchanged), and the token estimate each gives.

Pure: tables for the refusals, hypothesis for the round trips.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.errors import MalformedEnvelope
from runtime.policy.tokens import TokenCount, estimate_input_tokens, usage_tokens
from runtime.queue.leases import LeaseRecord
from runtime.wire.contract import (
    ChatCall,
    CompletionsCall,
    EmbeddingsCall,
    Envelope,
    StreamOptions,
)
from runtime.wire.operations import MAX_DIMENSIONS, MAX_INPUTS, decode_call

NOW = 1_800_000_000.0
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def envelope(call: Any, **kwargs: Any) -> Envelope:
    return Envelope("r1", "p1", "pool", call, NOW, **kwargs)


@pytest.mark.parametrize(
    ("body", "inputs"),
    [
        ({"model": "m", "input": "one text"}, 1),
        ({"model": "m", "input": ["a", "b", "c"]}, 3),
        ({"model": "m", "input": [1, 2, 3]}, 1),  # one input of token ids
        ({"model": "m", "input": [[1, 2], [3]]}, 2),
        ({"model": "m", "input": "x", "dimensions": 8, "encoding_format": "base64", "user": "u"}, 1),
        ({"model": "m", "input": "x", "dimensions": MAX_DIMENSIONS, "encoding_format": "float"}, 1),
        ({"model": "m", "input": "x", "dimensions": None, "provider_extra": {"a": 1}}, 1),
    ],
)
def test_embeddings_calls_in_every_input_form_keep_their_body(body: dict[str, Any], inputs: int) -> None:
    call = EmbeddingsCall.from_openai(body)
    assert call.to_openai() == body
    assert call.message_count == inputs and call.operation == "embeddings" and call.image_parts == 0


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"input": "x"}, "call.model must be a string"),
        ({"model": " ", "input": "x"}, "call.model must not be empty"),
        ({"model": "m"}, "call.input must be a string or a list, got NoneType"),
        ({"model": "m", "input": ""}, "call.input must not be empty"),
        ({"model": "m", "input": []}, "call.input must not be empty"),
        ({"model": "m", "input": ["a", ""]}, "call.input[1] must not be empty"),
        ({"model": "m", "input": ["a", 1]}, "call.input[1] must be a string like call.input[0]"),
        ({"model": "m", "input": [1, -2]}, "call.input[1] must be a token id >= 0"),
        ({"model": "m", "input": [[1], []]}, "call.input[1] must not be empty"),
        ({"model": "m", "input": [[1], [2.5]]}, "call.input[1] must hold token ids"),
        ({"model": "m", "input": [{"a": 1}]}, "call.input must be a string or a list of strings"),
        ({"model": "m", "input": ["a"] * (MAX_INPUTS + 1)}, f"over the limit of {MAX_INPUTS}"),
        ({"model": "m", "input": "x", "dimensions": 0}, "call.dimensions must be between 1 and"),
        ({"model": "m", "input": "x", "dimensions": -3}, "call.dimensions must be between 1 and"),
        ({"model": "m", "input": "x", "dimensions": MAX_DIMENSIONS + 1}, "call.dimensions must be between"),
        ({"model": "m", "input": "x", "dimensions": 1.5}, "call.dimensions must be an integer, got float"),
        (
            {"model": "m", "input": "x", "dimensions": True},
            "call.dimensions must be an integer, got a boolean",
        ),
        ({"model": "m", "input": "x", "encoding_format": "int8"}, "call.encoding_format must be one of"),
        ({"model": "m", "input": "x", "stream": True}, "call.stream is not supported"),
    ],
)
def test_embeddings_calls_refuse_what_openai_refuses(body: dict[str, Any], says: str) -> None:
    with pytest.raises(MalformedEnvelope) as caught:
        EmbeddingsCall.from_openai(body)
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("body", "prompts"),
    [
        ({"model": "m", "prompt": "Once upon a time"}, 1),
        ({"model": "m", "prompt": ""}, 1),  # OpenAI completes an empty prompt
        ({"model": "m", "prompt": ["a", "b"], "n": 2, "best_of": 3}, 2),
        ({"model": "m", "prompt": [5, 6, 7], "echo": True, "logprobs": 2, "suffix": "!"}, 1),
        ({"model": "m", "prompt": "x", "max_tokens": 4, "stop": ["\n"], "seed": 1, "vllm_extra": 1}, 1),
    ],
)
def test_completions_calls_keep_their_body(body: dict[str, Any], prompts: int) -> None:
    call = CompletionsCall.from_openai(body)
    assert call.to_openai() == body
    assert call.message_count == prompts and call.operation == "text_completion"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"model": "m"}, "call.prompt is required"),
        ({"model": "m", "prompt": {}}, "call.prompt must be a string or a list"),
        ({"model": "m", "prompt": []}, "call.prompt must not be empty"),
        ({"model": "m", "prompt": "x", "logprobs": True}, "call.logprobs must be an integer, got a boolean"),
        ({"model": "m", "prompt": "x", "echo": "yes"}, "call.echo must be a boolean"),
        ({"model": "m", "prompt": "x", "temperature": float("nan")}, "call.temperature must be finite"),
        ({"model": "m", "prompt": "x", "stream": True}, "call.stream is not supported"),
    ],
)
def test_completions_calls_refuse_bad_fields(body: dict[str, Any], says: str) -> None:
    with pytest.raises(MalformedEnvelope) as caught:
        CompletionsCall.from_openai(body)
    assert says in str(caught.value)


def test_an_envelope_names_its_endpoint_and_a_chat_envelope_is_written_as_before() -> None:
    chat = envelope(ChatCall.from_openai(CHAT)).encode()
    assert b'"endpoint"' not in chat  # what an older dispatcher reads, byte for byte
    embed = envelope(EmbeddingsCall.from_openai({"model": "m", "input": "x"})).encode()
    assert orjson.loads(embed)["endpoint"] == "embeddings"
    assert isinstance(Envelope.decode(embed).call, EmbeddingsCall)
    text = envelope(CompletionsCall.from_openai({"model": "m", "prompt": "x"}), stream=StreamOptions(True))
    decoded = Envelope.decode(text.encode())
    assert isinstance(decoded.call, CompletionsCall) and decoded.stream == StreamOptions(True)


def test_an_old_envelope_without_an_endpoint_decodes_as_chat() -> None:
    raw = orjson.loads(envelope(ChatCall.from_openai(CHAT)).encode())
    raw.pop("endpoint", None)
    assert isinstance(Envelope.decode(orjson.dumps(raw)).call, ChatCall)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"endpoint": "images"}, "envelope.endpoint must be one of"),
        ({"endpoint": ["embeddings"]}, "envelope.endpoint must be one of"),
        (
            {
                "endpoint": "embeddings",
                "call": {"model": "m", "input": "x"},
                "stream": {"include_usage": False},
            },
            "the embeddings endpoint does not stream",
        ),
        ({"endpoint": "completions"}, "call.prompt is required"),  # a chat body under another endpoint
    ],
)
def test_an_envelope_with_a_wrong_endpoint_is_malformed(change: dict[str, Any], says: str) -> None:
    raw = {**orjson.loads(envelope(ChatCall.from_openai(CHAT)).encode()), **change}
    with pytest.raises(MalformedEnvelope) as caught:
        Envelope.decode(orjson.dumps(raw))
    assert says in str(caught.value)


def test_token_estimates_count_an_embedding_as_input_only() -> None:
    embed = EmbeddingsCall.from_openai({"model": "m", "input": ["abcdefgh", "abc"]})
    assert embed.tokens(default_output_tokens=256) == TokenCount(2 + 1, 0)
    ids = EmbeddingsCall.from_openai({"model": "m", "input": [[1, 2, 3], [4]]})
    assert ids.tokens(256) == TokenCount(4, 0)
    text = CompletionsCall.from_openai({"model": "m", "prompt": ["abcd", "ab"], "max_tokens": 10, "n": 2})
    assert text.tokens(256) == TokenCount(2, 2 * 10 * 2)  # each prompt gets its n choices
    assert CompletionsCall.from_openai({"model": "m", "prompt": "abcd"}).tokens(7) == TokenCount(1, 7)


def test_an_embeddings_usage_has_no_output_tokens() -> None:
    answer = {"object": "list", "data": [], "usage": {"prompt_tokens": 12, "total_tokens": 12}}
    assert usage_tokens(answer) == TokenCount(12, 0)
    assert usage_tokens({"usage": {"prompt_tokens": 12}}) is None  # a chat answer without output: unknown


texts = st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=5)
token_lists = st.lists(st.lists(st.integers(0, 100_000), min_size=1, max_size=5), min_size=1, max_size=4)
inputs = st.one_of(
    st.text(min_size=1, max_size=40), texts, st.lists(st.integers(0, 9), min_size=1, max_size=50), token_lists
)
embedding_bodies = st.fixed_dictionaries(
    {"model": st.text(min_size=1, max_size=10).filter(str.strip), "input": inputs},
    optional={
        "dimensions": st.integers(1, MAX_DIMENSIONS),
        "encoding_format": st.sampled_from(["float", "base64"]),
        "user": st.text(max_size=8),
    },
)
completion_bodies = st.fixed_dictionaries(
    {"model": st.text(min_size=1, max_size=10).filter(str.strip), "prompt": inputs},
    optional={"max_tokens": st.integers(1, 4096), "n": st.integers(1, 8), "echo": st.booleans()},
)


@given(embedding_bodies, st.booleans())
def test_embeddings_envelopes_round_trip(body: dict[str, Any], tagged: bool) -> None:
    sent = envelope(EmbeddingsCall.from_openai(body), tenant="t" if tagged else None)
    raw = sent.encode()
    decoded = Envelope.decode(raw)
    assert decoded == sent and decoded.encode() == raw and decoded.call.to_openai() == body
    prompt, output = decoded.call.tokens(256)
    assert output == 0 and prompt == estimate_input_tokens(body["input"]) >= 1


@given(completion_bodies)
def test_completions_envelopes_round_trip(body: dict[str, Any]) -> None:
    sent = envelope(CompletionsCall.from_openai(body), stream=StreamOptions(include_usage=True))
    decoded = Envelope.decode(sent.encode())
    assert decoded == sent and decoded.call.to_openai() == body


@given(st.sampled_from(["chat.completions", "embeddings", "completions"]), st.dictionaries(
    st.sampled_from(["model", "messages", "input", "prompt", "dimensions", "n"]),
    st.one_of(st.none(), st.integers(-2, 3), st.text(max_size=3), st.lists(st.integers(-1, 2), max_size=2)),
))  # fmt: skip
def test_any_body_under_any_endpoint_decodes_or_is_malformed(endpoint: str, body: dict[str, Any]) -> None:
    """Whatever arrives, the decoder answers with a call or MalformedEnvelope, never another error."""
    try:
        call = decode_call(endpoint, body)
    except MalformedEnvelope:
        return
    assert call.endpoint == endpoint and call.to_openai() == body


@pytest.mark.parametrize("endpoint_call", [CompletionsCall.from_openai({"model": "m", "prompt": ["a", "b"]})])
def test_a_lease_record_keeps_the_operation_for_a_lost_calls_span(endpoint_call: Any) -> None:
    """A lost call's span is written from its lease record: it must name the operation too (a chat
    record is written as before, without the field)."""
    sent = envelope(endpoint_call)
    raw = LeaseRecord.encode_of(sent, pool_id="pool", claimed_at=NOW, dispatcher_id="d1", cost=1)
    record = LeaseRecord.decode(raw)
    assert (
        record is not None
        and raw == LeaseRecord.of(sent, pool_id="pool", claimed_at=NOW, dispatcher_id="d1", cost=1).encode()
    )
    subject = record.subject()
    assert (subject.operation, subject.message_count) == ("text_completion", 2)
    chat = LeaseRecord.encode_of(envelope(ChatCall.from_openai(CHAT)), pool_id="p", claimed_at=NOW,
                                 dispatcher_id="d1", cost=1)  # fmt: skip
    assert b"operation" not in chat and LeaseRecord.decode(chat).subject().operation == "chat"  # type: ignore[union-attr]
