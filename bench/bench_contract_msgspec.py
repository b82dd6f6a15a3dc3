"""Would msgspec Structs validate the envelope faster than the hand-written checks? (issue 20)

Run: ``pip install msgspec && python bench/bench_contract_msgspec.py`` (msgspec is not a dependency:
this measured why it was not adopted; bench/RESULTS.md has the figures).

Two places decode a call: the dispatcher decodes envelope bytes (``Envelope.decode``), and the ingress
and the producer build a call from a dict already parsed (``ChatCall.from_openai``). Structs drop the
fields they do not declare, but messages (``tool_calls``, ``name``...) and provider extras must reach
the backend untouched, so on the bytes path the prototype also parses the bytes with orjson; on the
dict path it validates with ``msgspec.convert``. Both sides interleaved, median over rounds.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import msgspec
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.wire.call import _check_messages
from runtime.wire.contract import PARAMETER_TYPES, ChatCall, Envelope, Metadata

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class TextPart(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class ImageURL(msgspec.Struct):
    url: str


class ImagePart(msgspec.Struct, tag_field="type", tag="image_url"):
    image_url: ImageURL


class AudioPart(msgspec.Struct, tag_field="type", tag="input_audio"):
    pass


class FilePart(msgspec.Struct, tag_field="type", tag="file"):
    pass


class RefusalPart(msgspec.Struct, tag_field="type", tag="refusal"):
    pass


class Message(msgspec.Struct):
    role: Role
    content: str | list[TextPart | ImagePart | AudioPart | FilePart | RefusalPart] | None = None


class Call(msgspec.Struct):
    model: str
    messages: list[Message]
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = None
    stop: str | list[Any] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    reasoning_effort: str | None = None
    metadata: dict[str, Any] | None = None
    stream: bool | None = None


class Meta(msgspec.Struct):
    image_count: int = 0
    page_count: int = 0
    cost_units: int | None = None
    labels: dict[str, str] = {}


class Env(msgspec.Struct):
    request_id: str
    producer_id: str
    pool_id: str
    call: Call
    enqueued_at: float
    v: int = 1
    deadline: float | None = None
    trace: dict[str, str] = {}
    metadata: Meta | None = None
    stream: dict[str, Any] | None = None
    attempt: int = 1
    requeues: int = 0


ENVELOPE = msgspec.json.Decoder(Env)
MESSAGES = list[Message]


def rules_a_struct_cannot_say(messages: list[Message], *ids: str) -> int:
    """Non-empty ids and messages, content required by role; returns the image parts."""
    if not all(ids) or not messages:
        raise ValueError("empty")
    images = 0
    for m in messages:
        if m.content is None and m.role not in ("assistant", "function"):
            raise ValueError("content is required")
        if type(m.content) is list:
            images += sum(type(p) is ImagePart for p in m.content)
    return images


def struct_decode(raw: bytes) -> Envelope:
    """The same Envelope as the hand-written decode builds (metadata and stream left at defaults)."""
    env = ENVELOPE.decode(raw)  # types, roles, part tags, with paths
    data = orjson.loads(raw)  # the untouched dicts the backend must receive
    rules_a_struct_cannot_say(env.call.messages, env.request_id, env.producer_id, env.pool_id, env.call.model)
    if not 0 <= env.enqueued_at <= 4_102_444_800:
        raise ValueError("out of range")
    body = data["call"]
    call = ChatCall(
        model=env.call.model,
        messages=tuple(body["messages"]),
        parameters={k: v for k, v in body.items() if k in PARAMETER_TYPES},
        extra={k: v for k, v in body.items() if k not in PARAMETER_TYPES and k not in ("model", "messages")},
    )
    return Envelope(
        request_id=env.request_id, producer_id=env.producer_id, pool_id=env.pool_id, call=call,
        enqueued_at=env.enqueued_at, deadline=env.deadline, trace=env.trace,
    )  # fmt: skip


def struct_messages(messages: list[Any]) -> int:
    return rules_a_struct_cannot_say(msgspec.convert(messages, MESSAGES), "x")


MESSAGES_SAMPLE = [
    {"role": "system", "content": "You are a helpful assistant that answers briefly."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture? " * 4},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        ],
    },
    {"role": "assistant", "content": "A cat."},
    {"role": "user", "content": "And its colour?"},
]


def timed(variants: dict[str, Callable[[], object]], n: int, rounds: int = 7) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        for name, fn in list(variants.items())[:: 1 if r % 2 else -1]:
            started = time.perf_counter()
            for _ in range(n):
                fn()
            results[name].append((time.perf_counter() - started) / n * 1e6)
    return results


def main() -> None:
    call = ChatCall.from_openai(
        {"model": "sim-model", "messages": MESSAGES_SAMPLE, "temperature": 0.2, "max_tokens": 100, "sim": {}}
    )
    raw = Envelope(
        request_id="r-0123456789abcdef", producer_id="p-1", pool_id="default", call=call,
        enqueued_at=time.time(), deadline=time.time() + 60,
        trace={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        metadata=Metadata(labels={"team": "a"}),
    ).encode()  # fmt: skip
    assert struct_messages(MESSAGES_SAMPLE) == _check_messages(MESSAGES_SAMPLE) == 1
    print(f"# envelope of {len(raw)} bytes, 4 messages, one image part; median µs, 7 rounds interleaved")
    bytes_path = {
        "hand Envelope.decode": lambda: Envelope.decode(raw),
        "Struct decode + orjson": lambda: struct_decode(raw),
    }
    dict_path = {
        "hand _check_messages": lambda: _check_messages(MESSAGES_SAMPLE),
        "msgspec.convert": lambda: struct_messages(MESSAGES_SAMPLE),
    }
    paths = {"bytes path (dispatcher)": bytes_path, "dict path (ingress): messages": dict_path}
    for title, variants in paths.items():
        for name, values in timed(variants, 20_000).items():
            print(f"{title}: {name}: {statistics.median(values):.1f}  {[round(v, 1) for v in values]}")
    for bad in ([{"role": "wizard", "content": "x"}], [{"role": "user", "content": [{"type": "text"}]}]):
        try:
            msgspec.convert(bad, MESSAGES)
        except msgspec.ValidationError as exc:
            print(f"msgspec says: {exc}")


if __name__ == "__main__":
    main()
