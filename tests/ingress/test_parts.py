"""The ingress's pure parts: error mapping, request parsing, the key cache, chunk filtering."""

from __future__ import annotations

import pytest

from ingress.app import choose_pool, parse_body, parse_stream, parse_timeout
from ingress.errors import QUEUE_FULL, ApiError, api_error_for
from ingress.errors import SHOWN_ERROR_TYPES as SHOWN
from ingress.grants import GrantCache
from ingress.selectors import KeyGrant
from runtime import errors
from runtime.dispatch.streaming import StreamSummary, for_client

GRANT = KeyGrant(1, "alice", frozenset({"gold", "iron"}), "gold", None, None)


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (errors.MalformedEnvelope("call.messages must be a list, got str"), 400, "invalid_request_error"),
        (errors.EnvelopeTooLarge("too big"), 413, "invalid_request_error"),
        (errors.UnknownPool("no pool"), 404, "not_found_error"),
        (errors.error_from_type(QUEUE_FULL, "full"), 429, "rate_limit_error"),
        (errors.QueueUnavailable("down"), 503, "service_unavailable"),
        (errors.Rejected("no endpoint"), 503, "service_unavailable"),
        (errors.BreakerOpen("open"), 503, "service_unavailable"),
        (errors.RequestExpired("late"), 504, "timeout"),
        (errors.RequestTimeout("late"), 504, "timeout"),
        (errors.DeadlineExceeded("cut short"), 504, "timeout"),
        (errors.DeadLettered("attempts exhausted"), 502, "api_error"),
        (errors.BackendHTTPError("500", status_code=500), 502, "api_error"),
        (errors.DispatchError("bug"), 500, "api_error"),
    ],
)
def test_errors_map_to_the_status_the_sdks_expect(
    error: errors.DispatchError, status: int, kind: str
) -> None:
    api_error = api_error_for(error)
    assert (api_error.status, api_error.type, api_error.code) == (status, kind, error.error_type)


@pytest.mark.parametrize(
    ("backend_status", "retry_after", "status", "kind", "retry_header"),
    [
        (400, None, 400, "invalid_request_error", None),
        (404, None, 404, "not_found_error", None),
        (422, None, 422, "invalid_request_error", None),
        (429, 7.0, 429, "rate_limit_error", 7.0),
        (429, None, 429, "rate_limit_error", 1.0),
        (500, None, 502, "api_error", None),
        (503, 3.0, 503, "service_unavailable", 3.0),
    ],
)
def test_a_backends_status_reaches_the_client(
    backend_status: int, retry_after: float | None, status: int, kind: str, retry_header: float | None
) -> None:
    error = errors.error_from_type(
        "backend_http_error",
        f"backend http://10.1.2.3:8100/v1 answered HTTP {backend_status}: bad",
        status_code=backend_status,
        retry_after_s=retry_after,
        backend_message="bad",
    )
    api_error = api_error_for(error)
    assert (api_error.status, api_error.type, api_error.retry_after_s) == (status, kind, retry_header)
    assert "10.1.2.3" not in api_error.message
    if status < 500:
        assert api_error.message == "bad"


@pytest.mark.parametrize("error_type", sorted(set(errors.ERROR_TYPES) - SHOWN))
def test_no_error_shows_an_internal_address(error_type: str) -> None:
    """Lower layers put backend and Valkey addresses in messages; the client never reads them (only
    messages the runtime writes from what the client knows are shown)."""
    leaky = "backend http://10.1.2.3:8100/v1 failed: Cannot connect to host 10.1.2.3:8100"
    api_error = api_error_for(errors.error_from_type(error_type, leaky))
    assert "10.1.2.3" not in api_error.message, api_error


def test_a_contract_message_names_the_clients_field() -> None:
    api_error = api_error_for(errors.MalformedEnvelope("call.messages[0].role must be one of ..."))
    assert api_error.message.startswith("messages[0].role") and api_error.param == "messages[0].role"


def test_queue_full_carries_retry_after() -> None:
    full = errors.error_from_type(QUEUE_FULL, "pool gold is full")
    full.retry_after_s = 2.5  # type: ignore[attr-defined]
    assert api_error_for(full).retry_after_s == 2.5


def test_pool_choice() -> None:
    assert choose_pool(GRANT, "") == "gold"
    assert choose_pool(GRANT, " iron ") == "iron"
    with pytest.raises(ApiError) as caught:
        choose_pool(GRANT, "secret")
    assert caught.value.status == 403 and "secret" in caught.value.message


@pytest.mark.parametrize("raw", ["0", "-1", "soon", "nan", "inf"])
def test_a_bad_timeout_header_is_a_400(raw: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_timeout(raw, 120)
    assert caught.value.status == 400 and "X-Dispatch-Timeout" in caught.value.message


def test_timeout_header() -> None:
    assert parse_timeout(None, 120) == 120 and parse_timeout("2.5", 120) == 2.5


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, (False, False)),
        ({"stream": None}, (False, False)),
        ({"stream": True}, (True, False)),
        ({"stream": True, "stream_options": {"include_usage": True}}, (True, True)),
    ],
)
def test_stream_options(body: dict[str, object], expected: tuple[bool, bool]) -> None:
    assert parse_stream(body) == expected
    assert "stream" not in body and "stream_options" not in body


@pytest.mark.parametrize(
    "body", [{"stream": 1}, {"stream_options": []}, {"stream_options": {"include_usage": "yes"}}]
)
def test_bad_stream_options(body: dict[str, object]) -> None:
    with pytest.raises(ApiError):
        parse_stream(body)


def test_body_must_be_a_json_object() -> None:
    with pytest.raises(ApiError, match="not valid JSON"):
        parse_body(b"{")
    with pytest.raises(ApiError, match="got str"):
        parse_body(b'"text"')


async def test_the_key_cache_refreshes_after_its_ttl() -> None:
    now = [0.0]
    lookups: list[str] = []
    answer: list[KeyGrant | None] = [GRANT]

    async def lookup(raw_key: str) -> KeyGrant | None:
        lookups.append(raw_key)
        return answer[0]

    cache = GrantCache(lookup, ttl_s=1.0, clock=lambda: now[0])
    assert await cache.get("k") == GRANT
    answer[0] = None  # revoked
    now[0] = 0.9
    assert await cache.get("k") == GRANT and len(lookups) == 1
    now[0] = 1.0
    assert await cache.get("k") is None and len(lookups) == 2


def test_usage_reaches_the_client_only_when_asked() -> None:
    usage_only = {"choices": [], "usage": {"completion_tokens": 3}}
    content = {"choices": [{"delta": {"content": "a"}}], "usage": None}
    assert for_client(usage_only, True) is usage_only
    assert for_client(usage_only, False) is None
    assert for_client(content, False) == {"choices": [{"delta": {"content": "a"}}]}


def test_the_summary_assembles_the_streamed_completion() -> None:
    summary = StreamSummary()
    summary.add({"model": "m", "choices": [{"delta": {"role": "assistant", "content": ""}}]}, 10.0)
    summary.add({"choices": [{"delta": {"content": "Hi"}}]}, 10.5)
    summary.add({"choices": [{"delta": {"content": " there"}, "finish_reason": "stop"}]}, 11.0)
    summary.add({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 2}}, 11.1)
    completion = summary.completion("r1")
    assert completion.body["choices"][0]["message"]["content"] == "Hi there"
    assert completion.body["choices"][0]["finish_reason"] == "stop"
    assert completion.usage is not None and completion.usage.output_tokens == 2
    assert (summary.chunks, summary.first_chunk_at, completion.model) == (4, 10.0, "m")
