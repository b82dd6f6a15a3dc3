"""Which pool an ingress request goes to: its model alias, its pool header, its key's default (pure)."""

from __future__ import annotations

import pytest

from ingress.aliases import Route, alias_models, route_request
from ingress.errors import ApiError
from ingress.selectors import KeyGrant
from runtime.wire.groupconfig import ModelAlias

WITH_DEFAULT = KeyGrant(1, "alice", frozenset({"gold", "iron"}), "gold", None, None)
NO_DEFAULT = KeyGrant(2, "bob", frozenset({"iron"}), "", None, None)
ALIASES = {
    "batch/llama": ModelAlias("batch/llama", "iron", "meta-llama/Llama-3-8B-Instruct"),
    "secret/model": ModelAlias("secret/model", "vault", "m"),
}


@pytest.mark.parametrize(
    ("grant", "header", "model", "route"),
    [
        (WITH_DEFAULT, "", "batch/llama", Route("iron", "meta-llama/Llama-3-8B-Instruct", "batch/llama")),
        (
            WITH_DEFAULT,
            " iron ",
            "batch/llama",
            Route("iron", "meta-llama/Llama-3-8B-Instruct", "batch/llama"),
        ),
        (WITH_DEFAULT, "", "gpt-4o", Route("gold")),  # no alias, no header: the key's default
        (WITH_DEFAULT, "iron", "gpt-4o", Route("iron")),
        (WITH_DEFAULT, "", None, Route("gold")),  # no model at all: the contract refuses it later
        (WITH_DEFAULT, "", ["batch/llama"], Route("gold")),  # not a string: never an alias
        (NO_DEFAULT, "", "batch/llama", Route("iron", "meta-llama/Llama-3-8B-Instruct", "batch/llama")),
        (NO_DEFAULT, "iron", "anything", Route("iron")),
    ],
)
def test_routes(grant: KeyGrant, header: str, model: object, route: Route) -> None:
    assert route_request(grant, header, model, ALIASES) == route


@pytest.mark.parametrize(
    ("grant", "header", "model", "status", "code"),
    [
        (WITH_DEFAULT, "gold", "batch/llama", 400, "model_pool_conflict"),
        (NO_DEFAULT, "", "gpt-4o", 400, "model_not_routed"),
        (NO_DEFAULT, "  ", "gpt-4o", 400, "model_not_routed"),
        (WITH_DEFAULT, "", "secret/model", 403, "pool_not_allowed"),
        (WITH_DEFAULT, "vault", "gpt-4o", 403, "pool_not_allowed"),
    ],
)
def test_refusals(grant: KeyGrant, header: str, model: str, status: int, code: str) -> None:
    with pytest.raises(ApiError) as caught:
        route_request(grant, header, model, ALIASES)
    assert (caught.value.status, caught.value.code) == (status, code)


def test_the_conflict_names_both_pools() -> None:
    with pytest.raises(ApiError) as caught:
        route_request(WITH_DEFAULT, "gold", "batch/llama", ALIASES)
    assert "pool 'iron'" in caught.value.message and "'gold'" in caught.value.message
    assert caught.value.param == "model"


def test_models_lists_only_the_aliases_of_allowed_pools() -> None:
    assert [m["id"] for m in alias_models(WITH_DEFAULT, ALIASES)] == ["batch/llama"]
    assert alias_models(KeyGrant(3, "c", frozenset({"vault"}), "vault", None, None), ALIASES)[0]["id"] == (
        "secret/model"
    )
