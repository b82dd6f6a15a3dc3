"""The producer takes the openai SDK's own request shapes and returns what the SDK's types validate.

Requests are written as the SDK's ``CompletionCreateParams`` TypedDicts (every message kind, content
parts, tools) and handed to ``Producer.submit`` / ``stream`` as they are; the replies, through a real
dispatcher and the simulator over HTTP (and on the direct path), must validate as ``ChatCompletion`` and
``ChatCompletionChunk``. (The ``producer`` fixture, on both paths, is tests/runtime/conftest.py's.)
"""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessageParam,
    ChatCompletionToolParam,
)
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)

from runtime.producer import Producer
from runtime.wire.contract import ChatCall

TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {
                "type": "object",
                "properties": {"word": {"type": "string"}},
                "required": ["word"],
            },
        },
    }
]
# One of each message kind the SDK types, in the shapes a conversation with tools takes.
CONVERSATION: list[ChatCompletionMessageParam] = [
    {"role": "developer", "content": "Answer briefly."},
    {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is on this page?"},
            {
                "type": "image_url",
                "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"},
            },
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "x"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "a letter"}]},
    {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot say more."}]},
    {"role": "assistant", "content": None, "function_call": {"name": "lookup", "arguments": "{}"}},
    {"role": "function", "name": "lookup", "content": None},
    {"role": "assistant", "audio": {"id": "audio_1"}},
    {"role": "user", "content": "And now?", "name": "ann"},
]
PLAIN: CompletionCreateParamsNonStreaming = {
    "model": "sim-model",
    "messages": CONVERSATION,
    "tools": TOOLS,
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "temperature": 0.2,
    "top_p": 0.9,
    "max_completion_tokens": 8,
    "stop": ["\n\n"],
    "seed": 7,
    "response_format": {"type": "text"},
    "metadata": {"team": "docs"},
    "user": "user-1",
    "stream": False,
}
STREAMED: CompletionCreateParamsStreaming = {
    "model": "sim-model",
    "messages": CONVERSATION,
    "max_tokens": 5,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def alone(message: ChatCompletionMessageParam) -> CompletionCreateParamsNonStreaming:
    return {"model": "m", "messages": [message]}


@pytest.mark.parametrize(
    "params",
    [
        PLAIN,
        alone({"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}),
        alone({"role": "function", "name": "f", "content": None}),
        alone({"role": "assistant", "audio": {"id": "a"}}),
        alone({"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": ""}}),
    ],
    ids=["every-kind", "refusal-part", "function-result", "assistant-audio", "function-call"],
)
def test_sdk_params_become_a_call_and_the_same_body_unchanged(params: dict[str, Any]) -> None:
    call = ChatCall.from_openai(params)
    assert call.to_openai() == {k: v for k, v in params.items() if k != "stream"}


async def test_submit_takes_sdk_params_and_returns_a_chat_completion(producer: Producer) -> None:
    result = await producer.submit(PLAIN, pool_id="default", timeout=30)
    completion = ChatCompletion.model_validate(result.completion)
    assert completion.choices[0].message.content and completion.usage is not None


async def test_stream_takes_sdk_streaming_params_and_yields_chunks_with_the_usage_asked_for(
    producer: Producer,
) -> None:
    """``stream_options.include_usage`` in the params asks for the usage chunk, as it does in the SDK."""
    chunks = [
        ChatCompletionChunk.model_validate(c) async for c in producer.stream(STREAMED, pool_id="default")
    ]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


async def test_the_keyword_wins_over_the_params_stream_options(producer: Producer) -> None:
    chunks = [c async for c in producer.stream(STREAMED, pool_id="default", include_usage=False)]
    assert all(c.get("usage") is None for c in chunks)
