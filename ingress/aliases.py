"""Which pool an ingress request goes to, and as which model: its key, its pool header, its model alias.

Pure: the grant, the header and the published aliases in, a :class:`Route` or an :class:`ApiError` out.

The rule, in order:

1. ``model`` is a model alias: the alias's pool serves it, as the alias's backend model. A pool header
   naming the same pool is fine; naming another is a 400 (``model_pool_conflict``): neither wins
   silently, as a client that sends both means one of them.
2. Otherwise the ``X-Dispatch-Pool`` header's pool, else the key's default pool, and the model as sent.
3. Neither (a key without a default pool): a 400 (``model_not_routed``) naming what to send.

The key must be allowed the pool in every case (403 ``pool_not_allowed``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ingress.errors import ApiError
from ingress.selectors import KeyGrant
from runtime.wire.groupconfig import ModelAlias

__all__ = ["POOL_HEADER", "Route", "alias_models", "choose_pool", "route_request"]

POOL_HEADER = "x-dispatch-pool"


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request goes: its pool, and the model the backend gets (None: the request's own)."""

    pool_id: str
    model: str | None = None
    alias: str | None = None  # the alias that chose the pool, for history


def choose_pool(grant: KeyGrant, requested: str) -> str:
    """The pool a request names (else the key's default), if the key may use it."""
    pool_id = requested.strip() or grant.default_pool
    if pool_id not in grant.pools:
        allowed = ", ".join(sorted(grant.pools))
        raise ApiError(
            403,
            f"key {grant.name!r} may not use pool {pool_id!r} (allowed: {allowed})",
            "permission_error",
            "pool_not_allowed",
            param=POOL_HEADER,
        )
    return pool_id


def route_request(grant: KeyGrant, requested: str, model: Any, aliases: Mapping[str, ModelAlias]) -> Route:
    """The request's route (see the module's rule)."""
    requested = requested.strip()
    alias = aliases.get(model) if isinstance(model, str) else None
    if alias is not None:
        if requested and requested != alias.pool_id:
            raise ApiError(
                400,
                f"model {model!r} is an alias of pool {alias.pool_id!r}, but X-Dispatch-Pool names pool "
                f"{requested!r}: send one of them, or make them agree",
                "invalid_request_error",
                "model_pool_conflict",
                param="model",
            )
        return Route(choose_pool(grant, alias.pool_id), alias.model, alias.alias)
    if not requested and not grant.default_pool:
        raise ApiError(
            400,
            f"model {model!r} is not a model alias and the request names no pool: send X-Dispatch-Pool "
            f"or one of the model aliases GET /v1/models lists (key {grant.name!r} has no default pool)",
            "invalid_request_error",
            "model_not_routed",
            param="model",
        )
    return Route(choose_pool(grant, requested))


def alias_models(grant: KeyGrant, aliases: Mapping[str, ModelAlias]) -> list[dict[str, Any]]:
    """The aliases the key may use, as ``GET /v1/models`` entries."""
    return [
        {"id": name, "object": "model", "created": 0, "owned_by": "llm-dispatch"}
        for name, alias in sorted(aliases.items())
        if alias.pool_id in grant.pools
    ]
