"""Malformed bodies get a 4xx with a clear message, and nothing reaches the queue or the backend."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.support.ingress_stack import Stack

pytestmark = pytest.mark.slow
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object, got list"),
        (orjson.dumps({"model": 7, "messages": HELLO}), 400, "model must be a string, got int"),
        (
            orjson.dumps({"model": "m", "messages": [{"role": "robot", "content": "x"}]}),
            400,
            "messages[0].role",
        ),
        (orjson.dumps({"model": "m", "messages": HELLO, "stream": "yes"}), 400, "stream must be a boolean"),
        (orjson.dumps({"model": "m", "messages": HELLO, "max_tokens": True}), 400, "max_tokens must be"),
        (b'{"model": "m", "messages": [], "pad": "' + b"x" * (10 * 1024 * 1024) + b'"}', 413, "exceeds"),
    ],
    ids=["not-json", "not-an-object", "model-type", "role", "stream-type", "bool-count", "10MB"],
)
def test_a_malformed_body_is_refused_and_nothing_is_queued(
    stack: Stack, alice_key: str, body: bytes, status: int, says: str
) -> None:
    calls_before = stack.sim_count()
    response = httpx.post(
        f"{stack.url}/v1/chat/completions",
        content=body,
        headers={"Authorization": f"Bearer {alice_key}", "content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert says in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"]
    assert response.headers["x-dispatch-request-id"]
    with stack.valkey() as client:
        assert client.llen(stack.keys.requests("gold")) == 0
    assert stack.sim_count() == calls_before


def test_a_missing_key_is_refused_before_the_body_is_read(stack: Stack) -> None:
    response = httpx.post(f"{stack.url}/v1/chat/completions", content=b"{}", timeout=10)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "missing_api_key"


def test_an_unknown_route_is_a_json_404(stack: Stack, alice_key: str) -> None:
    response = httpx.get(f"{stack.url}/v1/embeddings", headers={"Authorization": f"Bearer {alice_key}"})
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"
