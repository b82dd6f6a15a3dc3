"""The tenant of a call through the ingress (issue 22): its producer key, or a sub-tenant of it.

A key is one tenant, ``key-{id}``. A key with ``allow_sub_tenant`` lets its callers name a
sub-tenant, ``key-{id}:{sub}``: the ``X-Dispatch-Tenant`` header, else the OpenAI ``user`` field. A
sub-tenant that would not make a valid tenant id is MalformedEnvelope naming the field the caller set
(a 400). Without ``allow_sub_tenant`` both are ignored for fairness (``user`` still reaches the
backend).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ingress.selectors import KeyGrant
from runtime.wire.tenant import key_tenant

__all__ = ["TENANT_HEADER", "call_tenant"]

TENANT_HEADER = "x-dispatch-tenant"


def call_tenant(grant: KeyGrant, headers: Mapping[str, str], body: Mapping[str, Any]) -> str:
    """The call's tenant id; MalformedEnvelope for a sub-tenant that is not a valid one."""
    if grant.allow_sub_tenant:
        header = headers.get(TENANT_HEADER)
        if header is not None:
            return key_tenant(grant.key_id, header, what="X-Dispatch-Tenant")
        user = body.get("user")
        if user is not None:
            return key_tenant(grant.key_id, user, what="user")
    return key_tenant(grant.key_id)
