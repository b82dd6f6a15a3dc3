"""A fair pool's wake token (``<weight> <envelope>``, lua/_tenant_queue.lua) read back as the request
a lone dispatcher may claim from it: any bytes parse or are refused, never raise; the pick charges
what a view of the tenants would. Pure: no Valkey."""

from __future__ import annotations

import math
import time
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from runtime.dispatch.peek import PeekCache
from runtime.dispatch.tenant_round import token_pick
from runtime.policy.cost import CostModel
from runtime.policy.tenants import TenantCost
from runtime.policy.tokens import estimate_tokens
from runtime.queue.tenant_dispatch import token_request
from runtime.wire.contract import ChatCall, Envelope
from runtime.wire.groupconfig import PoolConfig

BODY: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hello there"}],
    "max_tokens": 8,
}
POOL = PoolConfig("chat", tenant_fairness="tokens")


def request(tenant: str | None, attempt: int = 1) -> bytes:
    call = ChatCall.from_openai(BODY)
    return Envelope("r1", "p1", "chat", call, time.time(), tenant=tenant, attempt=attempt).encode()


@given(st.binary(max_size=64))
def test_any_token_parses_to_a_positive_weight_and_a_request_or_is_refused(token: bytes) -> None:
    parsed = token_request(token)
    if parsed is not None:
        weight, raw = parsed
        assert 0 < weight < math.inf and raw and token.endswith(raw)


@given(st.floats(min_value=1e-6, max_value=1e6), st.binary(min_size=1, max_size=64))
def test_a_pushed_token_reads_back_as_its_weight_and_request(weight: float, raw: bytes) -> None:
    assert token_request(repr(weight).encode() + b" " + raw) == (weight, raw)


def test_tokens_that_are_no_fair_request_are_refused() -> None:
    raw = request("acme")
    for token in (b"1", raw, b"0 " + raw, b"-2 " + raw, b"nan " + raw, b"inf " + raw, b"2.0 ", b"2.0" + raw):
        assert token_request(token) is None, token


def test_the_pick_charges_the_estimate_over_the_tenants_weight() -> None:
    raw, weight = request("acme"), 2.0
    hint = token_pick(PeekCache(CostModel()), POOL, b"2.0 " + raw)
    assert hint is not None
    taken, pick = hint
    prompt, output = estimate_tokens(BODY["messages"], {"max_tokens": 8}, POOL.tenant_default_output_tokens)
    assert taken == raw and (pick.tenant, pick.weight, pick.from_token) == ("acme", weight, True)
    assert (pick.prompt_tokens, pick.output_tokens) == (prompt, output)
    assert pick.charge == TenantCost().of(prompt, output) / weight


def test_untagged_retried_and_malformed_requests() -> None:
    peek = PeekCache(CostModel())
    untagged = token_pick(peek, POOL, b"1.0 " + request(None))
    assert untagged is not None and untagged[1].tenant == "*"  # the seed's list, as tenant '*'
    retry = token_pick(peek, POOL, b"1.0 " + request("acme", attempt=2))
    assert retry is not None and retry[1].charge == 0.0  # charged at its first launch
    assert token_pick(peek, POOL, b"1.0 {not an envelope") is None  # a round reads the pool instead
