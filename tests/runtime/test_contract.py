"""Strict decoding of the wire contract: every malformed shape raises MalformedEnvelope."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.errors import EnvelopeTooLarge, MalformedEnvelope
from runtime.wire.contract import BackendAnswer, ChatCall, Envelope, Metadata, Reply, Timing

CALL = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def envelope(**overrides: object) -> Envelope:
    values: dict = {
        "request_id": "r1",
        "producer_id": "p1",
        "pool_id": "interactive",
        "call": ChatCall.from_openai(CALL),
        "enqueued_at": 1.0,
    }
    values.update(overrides)
    return Envelope(**values)


def test_envelope_round_trip_keeps_every_field() -> None:
    call = ChatCall.from_openai({**CALL, "temperature": 0.2, "tools": [], "vendor_knob": {"x": 1}})
    original = envelope(
        call=call,
        deadline=31.0,
        trace={"traceparent": "00-abc-def-01"},
        metadata=Metadata(image_count=2, page_count=3, cost_units=7, labels={"job": "a"}),
    )
    decoded = Envelope.decode(original.encode())
    assert decoded == original
    assert decoded.call.to_openai()["vendor_knob"] == {"x": 1}
    assert decoded.call.parameters == {"temperature": 0.2, "tools": []}


def test_request_id_is_the_first_field() -> None:
    assert envelope().encode().startswith(b'{"request_id":"r1"')


def test_image_parts_are_counted() -> None:
    call = ChatCall.from_openai(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "read"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                    ],
                }
            ],
        }
    )
    assert call.image_parts == 2


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("request_id"), "envelope.request_id"),
        (lambda d: d.update(request_id=""), "must not be empty"),
        (lambda d: d.update(pool_id=5), "envelope.pool_id must be a string"),
        (lambda d: d.update(enqueued_at="soon"), "envelope.enqueued_at"),
        (lambda d: d.update(enqueued_at=True), "boolean"),
        (lambda d: d.update(deadline="x"), "envelope.deadline"),
        (lambda d: d.update(enqueued_at=1e308), "envelope.enqueued_at is out of range"),
        (lambda d: d.update(enqueued_at=-1e308), "envelope.enqueued_at is out of range"),
        (lambda d: d.update(enqueued_at=-1), "envelope.enqueued_at is out of range"),
        (lambda d: d.update(deadline=1e308), "envelope.deadline is out of range"),
        (lambda d: d.update(deadline=-1e308), "envelope.deadline is out of range"),
        (lambda d: d.update(v=99), "version"),
        (lambda d: d.update(call=None), "call must be an object"),
        (lambda d: d["call"].update(model=""), "call.model must not be empty"),
        (lambda d: d["call"].update(messages=[]), "call.messages must not be empty"),
        (lambda d: d["call"].update(messages=[{"role": "wizard", "content": "x"}]), "role"),
        (lambda d: d["call"].update(messages=[{"role": "user"}]), "content is required"),
        (lambda d: d["call"].update(messages=[{"role": "user", "content": [{"type": "video"}]}]), "type"),
        (lambda d: d["call"].update(messages=[{"role": "user", "content": [{"type": "text"}]}]), "text"),
        (lambda d: d["call"].update(temperature="hot"), "call.temperature"),
        (lambda d: d["call"].update(max_tokens=1.5), "call.max_tokens"),
        (lambda d: d["call"].update(stream=True), "stream"),
        (lambda d: d.update(metadata={"image_count": -1}), "negative"),
        (lambda d: d.update(metadata={"cost_units": "big"}), "metadata.cost_units"),
        (lambda d: d.update(metadata={"labels": {"a": 1}}), "labels"),
        (lambda d: d.update(trace={"traceparent": 1}), "trace"),
    ],
)
def test_malformed_envelopes_say_what_is_wrong(mutate, message: str) -> None:
    data = orjson.loads(envelope().encode())
    mutate(data)
    with pytest.raises(MalformedEnvelope, match=message):
        Envelope.decode(orjson.dumps(data))


def _message(*content: object) -> Callable[[dict], None]:
    return lambda d: d["call"].update(messages=[{"role": "user", "content": list(content)}])


# Exact messages: the checks name the field only once it is wrong (issue 13), and must name it the
# same way as before, down to the index of the message and part.
@pytest.mark.parametrize(
    "mutate, message",
    [
        (_message({"type": "text", "text": "a"}, {"type": "text", "text": 1}),
         "call.messages[0].content[1].text must be a string, got int"),
        (_message({"type": "image_url", "image_url": "u"}),
         "call.messages[0].content[0].image_url must be an object, got str"),
        (_message({"type": "image_url", "image_url": {"url": 1}}),
         "call.messages[0].content[0].image_url.url must be a string, got int"),
        (_message("x"), "call.messages[0].content[0] must be an object, got str"),
        (_message({"type": "video"}),
         "call.messages[0].content[0].type must be one of ['file', 'image_url', 'input_audio', 'refusal', "
         "'text'], got 'video'"),
        (lambda d: d["call"].update(messages=[{"role": ["user"], "content": "a"}]),
         "call.messages[0].role must be one of "
         "['assistant', 'developer', 'function', 'system', 'tool', 'user'], got ['user']"),
        (_message({"type": {"t": 1}}),
         "call.messages[0].content[0].type must be one of ['file', 'image_url', 'input_audio', 'refusal', "
         "'text'], got {'t': 1}"),
        (lambda d: d["call"].update(messages=[{"role": "user", "content": "a"}, "x"]),
         "call.messages[1] must be an object, got str"),
        (lambda d: d["call"].update(messages=[{"role": "user", "content": {"a": 1}}]),
         "call.messages[0].content must be a list, got dict"),
        (lambda d: d.update(trace={"a": "b", "c": 2}), "envelope.trace['c'] must be a string, got int"),
        (lambda d: d.update(metadata={"labels": {"a": "b", "c": None}}),
         "metadata.labels['c'] must be a string, got NoneType"),
        (lambda d: d.update(producer_id=""), "envelope.producer_id must not be empty"),
        (lambda d: d.update(enqueued_at=True),
         "envelope.enqueued_at must be an integer or a number, got a boolean"),
        (lambda d: d.update(attempt=1.0), "envelope.attempt must be an integer, got float"),
        (lambda d: d.update(attempt=True), "envelope.attempt must be an integer, got a boolean"),
        (lambda d: d.update(attempt=0), "envelope.attempt must be at least 1, got 0"),
        (lambda d: d.update(requeues=False), "envelope.requeues must be an integer, got a boolean"),
        (lambda d: d.update(requeues=-1), "envelope.requeues must be at least 0, got -1"),
    ],
)  # fmt: skip
def test_malformed_envelopes_name_the_field_exactly(mutate, message: str) -> None:
    data = orjson.loads(envelope().encode())
    mutate(data)
    with pytest.raises(MalformedEnvelope) as raised:
        Envelope.decode(orjson.dumps(data))
    assert str(raised.value) == message


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


@given(role=JSON, kind=JSON, text=JSON)
def test_any_json_in_a_message_is_accepted_or_malformed(role, kind, text) -> None:
    """Never another exception: a TypeError (an unhashable role) failed every round of the group."""
    data = orjson.loads(envelope().encode())
    data["call"]["messages"] = [{"role": role, "content": [{"type": kind, "text": text}]}]
    with contextlib.suppress(MalformedEnvelope):
        Envelope.decode(orjson.dumps(data))


def test_accepted_shapes_decode_to_the_same_values() -> None:
    data = orjson.loads(envelope().encode())
    data.update(enqueued_at=5, deadline=7, attempt=2, requeues=1, trace={"traceparent": "00-x"})
    data["call"]["messages"] = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "t"}]},
        {
            "role": "user",
            "content": [{"type": "input_audio"}, {"type": "file"}, {"type": "text", "text": "a"}],
        },
    ]
    decoded = Envelope.decode(orjson.dumps(data))
    assert (decoded.enqueued_at, decoded.deadline) == (5.0, 7.0)
    assert isinstance(decoded.enqueued_at, float) and isinstance(decoded.deadline, float)
    assert (decoded.attempt, decoded.requeues, decoded.trace) == (2, 1, {"traceparent": "00-x"})
    assert decoded.call.image_parts == 0


def test_image_parts_counted_while_decoding_match_a_recount() -> None:
    image = {"type": "image_url", "image_url": {"url": "u"}}
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": [image, {"type": "text", "text": "a"}, image]},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [image]},
        ],
    }
    call = ChatCall.from_openai(body)
    built = ChatCall(model="m", messages=tuple(body["messages"]))  # not decoded: counted on demand
    assert call.image_parts == built.image_parts == 3
    assert call == built
    from dataclasses import replace

    assert replace(call, messages=(body["messages"][2],)).image_parts == 1  # a changed call recounts


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1,2]", b"null", b'"str"', b"{", b"\xff\xfe"])
def test_garbage_is_malformed(raw: bytes) -> None:
    with pytest.raises(MalformedEnvelope):
        Envelope.decode(raw)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_anything_but_malformed(raw: bytes) -> None:
    with contextlib.suppress(MalformedEnvelope):
        Envelope.decode(raw)


def test_envelope_over_the_limit_is_refused_at_encode() -> None:
    big = ChatCall.from_openai({"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]})
    with pytest.raises(EnvelopeTooLarge, match="over the limit of 2048"):
        envelope(call=big).encode(max_bytes=2048)


def test_reply_round_trip_ok_and_error() -> None:
    ok = Reply("r1", "ok", completion={"choices": []}, timing=Timing(0.1, 0.2, 0.3))
    assert Reply.decode(ok.encode()) == ok
    err = Reply("r2", "error", error_type="backend_timeout", error_message="slow")
    assert Reply.decode(err.encode()) == err
    said = Reply(
        "r3", "error", error_type="backend_http_error", error_message="backend x answered HTTP 429: wait",
        backend=BackendAnswer(429, "wait", 2.5),
    )  # fmt: skip
    assert Reply.decode(said.encode()) == said


@pytest.mark.parametrize(
    "data",
    [
        {"request_id": "r", "status": "maybe"},
        {"request_id": "r", "status": "ok"},
        {"request_id": "r", "status": "error"},
        {"status": "ok", "completion": {}},
    ],
)
def test_malformed_replies(data: dict) -> None:
    with pytest.raises(MalformedEnvelope):
        Reply.decode(orjson.dumps(data))


@pytest.mark.parametrize("fields", [{"enqueued_at": 1e308}, {"deadline": 1e12}, {"deadline": float("nan")}])
def test_encode_refuses_times_the_dispatcher_would_refuse(fields) -> None:
    from dataclasses import replace

    with pytest.raises(MalformedEnvelope, match="out of range"):
        replace(envelope(), **fields).encode()
