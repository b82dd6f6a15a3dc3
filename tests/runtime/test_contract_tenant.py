"""The envelope's optional tenant (issue 22): absent for untagged traffic, bounded when present."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.errors import MalformedEnvelope
from runtime.wire.contract import ChatCall, Envelope
from runtime.wire.tenant import MAX_TENANT_LENGTH, check_tenant, key_tenant

CALL = ChatCall.from_openai({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
UNTAGGED = Envelope("r1", "p1", "interactive", CALL, enqueued_at=1.0)
# The bytes of an untagged envelope as encoded before the tenant field existed.
SEED_BYTES = (
    b'{"request_id":"r1","v":1,"producer_id":"p1","pool_id":"interactive","call":{"model":"m",'
    b'"messages":[{"role":"user","content":"hi"}]},"trace":{},"enqueued_at":1.0,"deadline":null,'
    b'"metadata":{"image_count":0,"page_count":0,"cost_units":null,"labels":{}}}'
)


def test_untagged_envelope_is_byte_identical_to_the_seeds() -> None:
    assert UNTAGGED.encode() == SEED_BYTES
    assert Envelope.decode(SEED_BYTES).tenant is None


@pytest.mark.parametrize(
    "tenant",
    ["acme", "key-7:alice@example.com", "u/2f1c0e7a-9b7e-4c1e", "a", "x" * MAX_TENANT_LENGTH, "k+1=2"],
)
def test_tenant_round_trips(tenant: str) -> None:
    tagged = dataclasses.replace(UNTAGGED, tenant=tenant)
    raw = tagged.encode()
    assert orjson.loads(raw)["tenant"] == tenant
    assert Envelope.decode(raw) == tagged
    assert raw.startswith(b'{"request_id":"r1"')  # still first: a truncated item names its request


@pytest.mark.parametrize(
    ("tenant", "message"),
    [
        ("", "envelope.tenant must not be empty"),
        ("x" * (MAX_TENANT_LENGTH + 1), f"over the limit of {MAX_TENANT_LENGTH}"),
        ("alice smith", "may only hold ASCII letters, digits and . _ - : @ + = /; it holds ' '"),
        ("a{b}", "it holds '{'"),  # a Valkey hash tag would pin keys to a slot
        ("é", "it holds 'é'"),
        ("a\nb", "it holds '\\n'"),
        (7, "envelope.tenant must be a string, got int"),
        (["a"], "envelope.tenant must be a string, got list"),
    ],
)
def test_malformed_tenant_says_what_is_wrong(tenant: object, message: str) -> None:
    data = orjson.loads(SEED_BYTES)
    data["tenant"] = tenant
    with pytest.raises(MalformedEnvelope) as caught:
        Envelope.decode(orjson.dumps(data))
    assert message in str(caught.value)
    with pytest.raises(MalformedEnvelope):  # a producer cannot queue what a dispatcher would refuse
        dataclasses.replace(UNTAGGED, tenant=tenant).encode()  # type: ignore[arg-type]


def test_null_tenant_is_untagged() -> None:
    data = orjson.loads(SEED_BYTES)
    data["tenant"] = None
    assert Envelope.decode(orjson.dumps(data)).tenant is None


@given(st.text(max_size=MAX_TENANT_LENGTH + 10))
def test_any_string_is_a_tenant_or_malformed(value: str) -> None:
    try:
        assert check_tenant(value) == value
    except MalformedEnvelope:
        return
    assert 1 <= len(value) <= MAX_TENANT_LENGTH and value.isascii() and " " not in value


@pytest.mark.parametrize(
    ("key_id", "sub", "tenant"),
    [(7, None, "key-7"), (7, "alice@example.com", "key-7:alice@example.com"), ("12", "u-1", "key-12:u-1")],
)
def test_key_tenant(key_id: int | str, sub: str | None, tenant: str) -> None:
    assert key_tenant(key_id, sub) == tenant


@pytest.mark.parametrize(
    ("sub", "message"),
    [
        ("", "X-Dispatch-Tenant must not be empty"),
        ("Alice Smith", "X-Dispatch-Tenant may only hold"),
        ("x" * 200, "X-Dispatch-Tenant is 200 characters long, over the limit of 122"),
    ],
)
def test_key_tenant_names_the_field_the_caller_set(sub: str, message: str) -> None:
    with pytest.raises(MalformedEnvelope, match=message):
        key_tenant(7, sub, what="X-Dispatch-Tenant")


@given(st.integers(0, 10**9), st.text(max_size=200))
def test_key_tenant_is_always_a_valid_tenant_or_malformed(key_id: int, sub: str) -> None:
    try:
        tenant = key_tenant(key_id, sub)
    except MalformedEnvelope:
        return
    assert check_tenant(tenant) == tenant
