"""The tenant of an ingress call (issue 22): its key, or a sub-tenant the key allows its callers."""

from __future__ import annotations

import pytest

from ingress.errors import api_error_for
from ingress.selectors import KeyGrant
from ingress.tenancy import call_tenant
from runtime.errors import MalformedEnvelope

KEY = KeyGrant(7, "team a", frozenset({"gold"}), "gold", None, None)
SUBS = KeyGrant(7, "team a", frozenset({"gold"}), "gold", None, None, 2.0, True)


@pytest.mark.parametrize(
    ("grant", "headers", "body", "tenant"),
    [
        (KEY, {}, {}, "key-7"),  # the key's id, never its name (which may hold spaces)
        (KEY, {"x-dispatch-tenant": "bob"}, {"user": "carol"}, "key-7"),  # not allowed: ignored
        (KEY, {"x-dispatch-tenant": "has space"}, {"user": ["x"]}, "key-7"),  # not even checked
        (SUBS, {}, {}, "key-7"),
        (SUBS, {}, {"user": "carol@example.com"}, "key-7:carol@example.com"),
        (SUBS, {"x-dispatch-tenant": "bob"}, {"user": "carol"}, "key-7:bob"),  # the header wins
    ],
)
def test_the_tenant_of_a_call(grant: KeyGrant, headers: dict, body: dict, tenant: str) -> None:
    assert call_tenant(grant, headers, body) == tenant


@pytest.mark.parametrize(
    ("headers", "body", "field"),
    [
        ({"x-dispatch-tenant": "has space"}, {}, "X-Dispatch-Tenant"),
        ({}, {"user": "a{b}"}, "user"),
        ({}, {"user": 12}, "user"),
        ({}, {"user": "x" * 200}, "user"),
    ],
)
def test_a_bad_sub_tenant_is_a_400_naming_the_field(headers: dict, body: dict, field: str) -> None:
    with pytest.raises(MalformedEnvelope, match=field) as caught:
        call_tenant(SUBS, headers, body)
    assert api_error_for(caught.value).status == 400
