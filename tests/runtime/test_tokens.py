"""Tests for runtime.policy.tokens: the launch estimate (tables, properties) and the usage read-back."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.errors import MalformedEnvelope
from runtime.policy.tokens import (
    ATTACHMENT_TOKENS,
    IMAGE_TOKENS,
    MAX_TOKENS,
    MESSAGE_OVERHEAD,
    REPLY_OVERHEAD,
    TokenCount,
    estimate_output_tokens,
    estimate_prompt_tokens,
    estimate_tokens,
    usage_tokens,
)
from runtime.wire.contract import ChatCall

BASE = REPLY_OVERHEAD + MESSAGE_OVERHEAD  # one message with empty content


def user(content: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": content, **extra}


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([user("")], BASE),
        ([user("abcd")], BASE + 1),
        ([user("abcde")], BASE + 2),  # rounded up: a partial token is a token
        ([user("a" * 400)], BASE + 100),
        ([user("hi"), {"role": "assistant", "content": "hello"}], BASE + MESSAGE_OVERHEAD + 1 + 2),
        ([user([{"type": "text", "text": "abcdefgh"}])], BASE + 2),
        ([user([{"type": "image_url", "image_url": {"url": "data:x"}}])], BASE + IMAGE_TOKENS),
        ([user([{"type": "input_audio", "input_audio": {}}, {"type": "file", "file": {}}])],
         BASE + 2 * ATTACHMENT_TOKENS),
        ([{"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get", "arguments": '{"city":"Oslo"}'}}]}],
         BASE + 1 + 4),
        ([user("abcd", name="bob")], BASE + 1 + 1),
        ([{"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}], BASE + 1),
    ],
)  # fmt: skip
def test_prompt_estimate(messages: list[dict[str, Any]], expected: int) -> None:
    assert estimate_prompt_tokens(messages) == expected


@pytest.mark.parametrize(
    ("parameters", "default", "expected"),
    [
        ({}, 256, 256),  # the pool's default
        ({"max_tokens": 100}, 256, 100),
        ({"max_completion_tokens": 50, "max_tokens": 100}, 256, 50),  # the newer name wins
        ({"max_tokens": 100, "n": 3}, 256, 300),  # every choice is generated
        ({"max_tokens": 0}, 256, 256),  # not a usable cap: the default
        ({"max_tokens": None}, 256, 256),
        ({"n": -2}, 10, 10),
        ({"n": 10_000, "max_tokens": 10}, 0, 1280),  # n capped at OpenAI's 128
        ({"max_tokens": 10**12}, 0, MAX_TOKENS),
        ({}, -5, 0),
    ],
)
def test_output_estimate(parameters: dict[str, Any], default: int, expected: int) -> None:
    assert estimate_output_tokens(parameters, default) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ({"usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}, TokenCount(12, 3)),
        ({"choices": []}, None),  # a backend that reports no usage: the estimate stands
        ({"usage": None}, None),
        ({"usage": {"prompt_tokens": 12}}, None),
        ({"usage": {"prompt_tokens": -1, "completion_tokens": 3}}, None),
        ({"usage": {"prompt_tokens": 1.5, "completion_tokens": 3}}, None),
        ({"usage": {"prompt_tokens": True, "completion_tokens": 3}}, None),
        ({"usage": {"prompt_tokens": 10**12, "completion_tokens": 0}}, TokenCount(MAX_TOKENS, 0)),
        (None, None),
        ("not an object", None),
    ],
)
def test_usage_read_back(completion: Any, expected: TokenCount | None) -> None:
    assert usage_tokens(completion) == expected


# A contract-valid message: what ChatCall.from_openai accepts.
text_part = st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=200)})
image_part = st.fixed_dictionaries(
    {"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": st.text(max_size=20)})}
)
other_part = st.fixed_dictionaries({"type": st.sampled_from(["input_audio", "file", "refusal"])})
content = st.one_of(st.text(max_size=500), st.lists(st.one_of(text_part, image_part, other_part), max_size=5))
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]), "content": content},
    optional={"name": st.one_of(st.text(max_size=10), st.integers()), "tool_calls": st.one_of(
        st.none(), st.lists(st.dictionaries(st.sampled_from(["function", "id"]), st.one_of(
            st.none(), st.text(max_size=5), st.dictionaries(st.sampled_from(["name", "arguments"]),
                                                          st.one_of(st.text(max_size=30), st.integers())))),
                            max_size=3))},
)  # fmt: skip
parameters = st.dictionaries(
    st.sampled_from(["max_tokens", "max_completion_tokens", "n", "temperature"]),
    st.one_of(st.none(), st.integers(-(10**15), 10**15), st.floats(allow_nan=False)),
)


@given(st.lists(message, min_size=1, max_size=8), parameters, st.integers(-100, 100_000))
def test_any_contract_valid_call_gets_a_bounded_estimate(
    messages: list[dict[str, Any]], params: dict[str, Any], default: int
) -> None:
    body = {"model": "m", "messages": messages}
    try:
        call = ChatCall.from_openai(body)
    except MalformedEnvelope:  # only calls the contract accepts are the subject here
        return
    estimate = estimate_tokens(call.messages, params, default)
    assert BASE <= estimate.prompt <= MAX_TOKENS
    assert 0 <= estimate.output <= MAX_TOKENS


@given(st.lists(message, min_size=1, max_size=5), st.text(max_size=300))
def test_more_text_never_costs_less(messages: list[dict[str, Any]], more: str) -> None:
    longer = [*messages, user(more)]
    assert estimate_prompt_tokens(longer) >= estimate_prompt_tokens(messages) + MESSAGE_OVERHEAD
    grown = [*messages[:-1], user("x" + more)]
    shorter = [*messages[:-1], user(more)]
    assert estimate_prompt_tokens(grown) >= estimate_prompt_tokens(shorter)


@given(st.integers(1, 100_000), st.integers(1, 100_000), st.integers(0, 1000))
def test_a_larger_cap_never_estimates_less(cap: int, extra: int, default: int) -> None:
    assert estimate_output_tokens({"max_tokens": cap + extra}, default) >= estimate_output_tokens(
        {"max_tokens": cap}, default
    )
