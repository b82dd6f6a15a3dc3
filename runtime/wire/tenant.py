"""The tenant a queued request belongs to: who it is fair to inside its pool (issue 22).

A tenant id ends up in Valkey key names (a pool's sub-queue per tenant), in history spans and in
metrics labels, so it is short and plain: 1 to :data:`MAX_TENANT_LENGTH` characters of ASCII
letters, digits and ``. _ - : @ + = /``. That covers the ingress's own ids (a producer key, or a key
and a caller's sub-tenant such as an e-mail address or a UUID) and leaves out spaces, quotes,
braces (Valkey's hash tags) and control characters. Untagged traffic has no tenant at all.
"""

from __future__ import annotations

import re
from typing import Any

from runtime.errors import MalformedEnvelope

__all__ = ["MAX_TENANT_LENGTH", "TENANT_CHARACTERS", "check_tenant", "key_tenant"]

MAX_TENANT_LENGTH = 128
TENANT_CHARACTERS = "ASCII letters, digits and . _ - : @ + = /"
_TENANT_RE = re.compile(r"[A-Za-z0-9._:@+=/-]+")


def check_tenant(value: Any, what: str = "envelope.tenant") -> str:
    """``value`` if it is a valid tenant id; else MalformedEnvelope saying what is wrong with it."""
    if type(value) is not str:
        raise MalformedEnvelope(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise MalformedEnvelope(f"{what} must not be empty (leave it out for untagged traffic)")
    if len(value) > MAX_TENANT_LENGTH:
        raise MalformedEnvelope(
            f"{what} is {len(value)} characters long, over the limit of {MAX_TENANT_LENGTH}"
        )
    if not _TENANT_RE.fullmatch(value):
        bad = next(c for c in value if not _TENANT_RE.fullmatch(c))
        raise MalformedEnvelope(f"{what} may only hold {TENANT_CHARACTERS}; it holds {bad!r}")
    return value


def key_tenant(key_id: int | str, sub_tenant: str | None = None, *, what: str = "tenant") -> str:
    """The tenant of a call through the ingress: its producer key (``key-{id}``: a key's name may
    hold spaces, its id never does), or ``key-{id}:{sub}`` for a sub-tenant the caller named (the
    ``user`` field or ``X-Dispatch-Tenant``, on a key that allows it). A sub-tenant that would not
    make a valid tenant id is MalformedEnvelope naming ``what`` (the field the caller set)."""
    tenant = f"key-{key_id}"
    if sub_tenant is None:
        return check_tenant(tenant)
    room = MAX_TENANT_LENGTH - len(tenant) - 1
    if type(sub_tenant) is str and len(sub_tenant) > room:
        raise MalformedEnvelope(f"{what} is {len(sub_tenant)} characters long, over the limit of {room}")
    check_tenant(sub_tenant, what)
    return f"{tenant}:{sub_tenant}"
