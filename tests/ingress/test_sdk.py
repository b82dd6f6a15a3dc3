"""The real openai SDK (sync and async) against real daphne, dispatcher and simulator processes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.support.ingress_stack import Stack
from tests.support.waiting import wait_until_sync

pytestmark = pytest.mark.slow
HELLO = [{"role": "user", "content": "Hello"}]


def client(stack: Stack, key: str, **kwargs: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0, **kwargs)  # type: ignore[arg-type]


def test_a_plain_completion_through_the_queue(stack: Stack, alice_key: str) -> None:
    raw = client(stack, alice_key).chat.completions.with_raw_response.create(
        model="sim-model", messages=HELLO
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    assert len(raw.headers["x-dispatch-request-id"]) == 32
    assert float(raw.headers["x-dispatch-queue-wait-ms"]) >= 0
    last_used = (
        "from ingress.models import ProducerKey; print(ProducerKey.objects.get(name='alice').last_used_at)"
    )
    # Recorded in the background, at most once a minute per key and web process.
    wait_until_sync(lambda: stack.manage("shell", "-c", last_used).strip() != "None", 10, what="last used")


async def test_the_async_client_and_the_pool_header(stack: Stack, alice_key: str) -> None:
    async with openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=alice_key, max_retries=0) as api:
        completion = await api.chat.completions.create(
            model="sim-model",
            messages=HELLO,
            extra_headers={"X-Dispatch-Pool": "iron"},  # type: ignore[arg-type]
        )
        models = await api.models.list()
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert [m.id for m in models.data] == ["sim-model"]


def test_a_bad_key_is_refused(stack: Stack) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        client(stack, "ldk-not-a-key").chat.completions.create(model="m", messages=HELLO)  # type: ignore[arg-type]
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"


def test_a_revoked_key_is_refused(stack: Stack) -> None:
    key = stack.create_key("revoked-soon", "gold")
    api = client(stack, key)
    assert api.chat.completions.create(model="m", messages=HELLO).choices  # type: ignore[arg-type]
    stack.revoke("revoked-soon")

    def refused() -> bool:
        try:
            api.chat.completions.create(model="m", messages=HELLO)  # type: ignore[arg-type]
        except openai.AuthenticationError:
            return True
        return False

    wait_until_sync(refused, timeout=5, interval=0.2, what="the revoked key refused")


def test_a_pool_the_key_does_not_allow_is_refused(stack: Stack) -> None:
    api = client(stack, stack.create_key("iron-only", "iron"))
    with pytest.raises(openai.PermissionDeniedError) as caught:
        api.chat.completions.create(
            model="m",
            messages=HELLO,
            extra_headers={"X-Dispatch-Pool": "gold"},  # type: ignore[arg-type]
        )
    assert "gold" in caught.value.message and caught.value.code == "pool_not_allowed"


def test_an_unknown_pool_is_not_found(stack: Stack, alice_key: str) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client(stack, alice_key).chat.completions.create(
            model="m",
            messages=HELLO,
            extra_headers={"X-Dispatch-Pool": "dormant"},  # type: ignore[arg-type]
        )
    assert "dormant" in caught.value.message


def test_wrong_field_types_name_the_field(stack: Stack, alice_key: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(stack, alice_key).chat.completions.create(model="m", messages="hi")  # type: ignore[arg-type]
    assert "messages" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client(stack, alice_key).chat.completions.create(
            model="m",
            messages=HELLO,
            temperature="hot",  # type: ignore[arg-type]
        )
    assert "temperature must be an integer or a number, got str" in caught.value.message
    assert caught.value.param == "temperature"


def test_a_body_over_the_limit_is_413(stack: Stack, alice_key: str) -> None:
    huge = [{"role": "user", "content": "x" * (10 * 1024 * 1024)}]
    with pytest.raises(openai.APIStatusError) as caught:
        client(stack, alice_key).chat.completions.create(model="m", messages=huge)  # type: ignore[arg-type]
    assert caught.value.status_code == 413
    assert caught.value.code == "request_too_large"


def test_a_pool_without_a_backend_is_unavailable(stack: Stack, alice_key: str) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        client(stack, alice_key).chat.completions.create(
            model="m",
            messages=HELLO,
            extra_headers={"X-Dispatch-Pool": "noend"},  # type: ignore[arg-type]
        )
    assert caught.value.status_code == 503


def test_a_deadline_passed_in_the_queue_is_a_gateway_timeout(stack: Stack, alice_key: str) -> None:
    api = client(stack, alice_key)
    with pytest.raises(openai.InternalServerError) as caught:
        api.chat.completions.create(
            model="m", messages=HELLO, extra_body={"sim": {"latency_ms": 3000}},  # type: ignore[arg-type]
            extra_headers={"X-Dispatch-Pool": "solo", "X-Dispatch-Timeout": "0.5"},
        )  # fmt: skip
    assert caught.value.status_code == 504


def test_more_than_the_keys_in_flight_limit_is_rate_limited(stack: Stack) -> None:
    api = client(stack, stack.create_key("limited", "gold", "--max-in-flight", "1"), timeout=20)
    with ThreadPoolExecutor(1) as threads:
        # The first call stays open for 5 s (room for a loaded machine); a second one meanwhile is over
        # the key's limit.
        first = threads.submit(
            api.chat.completions.create, model="m", messages=HELLO, extra_body={"sim": {"latency_ms": 5000}}
        )
        # The second call starts once the first is running at the backend: sent earlier, it could be the
        # one in flight when the first arrives.
        wait_until_sync(lambda: stack.sim_running() >= 1, timeout=10, what="the first call running")
        with pytest.raises(openai.RateLimitError) as caught:
            wait_until_sync(lambda: _second_call(api), timeout=10, what="the second call refused")
        assert first.result().choices
    assert caught.value.response.headers["retry-after"] == "1"
    assert caught.value.code == "too_many_in_flight"


def _second_call(api: openai.OpenAI) -> bool:
    api.chat.completions.create(model="m", messages=HELLO)  # type: ignore[arg-type]
    return False
