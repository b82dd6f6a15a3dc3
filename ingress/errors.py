"""Errors in OpenAI's JSON shape, with the status codes the OpenAI SDKs map to their exception classes.

Pure: :func:`api_error_for` turns one of :mod:`runtime.errors` into an :class:`ApiError`; the ingress
writes it. 400 ``BadRequestError``, 401 ``AuthenticationError``, 403 ``PermissionDeniedError``, 404
``NotFoundError``, 413 ``APIStatusError``, 429 ``RateLimitError``, 5xx ``InternalServerError``.

A backend's 4xx goes to the client with the backend's own status and message (a 502 would make the
SDKs send the same bad request twice more); its 429 keeps its Retry-After; a 5xx becomes 502 (503 when
the backend said 503). Failures that happened between us and a backend are told in fixed words:
their messages name backend addresses (and Valkey's), which an API client must never learn.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from runtime.errors import BackendHTTPError, DispatchError, QueueFull
from runtime.policy.admission import REASON_KEY_IN_FLIGHT, REASON_KEY_QUEUED

QUEUE_FULL = "queue_full"
# A key's own limits refused the request: the code says which (a pool's refusal says queue_full).
_KEY_LIMIT_CODES = {REASON_KEY_IN_FLIGHT: "too_many_in_flight", REASON_KEY_QUEUED: "too_many_queued"}


@dataclass
class ApiError(Exception):
    """One refused or failed ingress request, as the client will see it."""

    status: int
    message: str
    type: str
    code: str
    param: str | None = None
    retry_after_s: float | None = None

    def body(self) -> bytes:
        return orjson.dumps(
            {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        )


# error_type -> (HTTP status, OpenAI error type)
_BY_ERROR_TYPE: dict[str, tuple[int, str]] = {
    "invalid_request": (400, "invalid_request_error"),
    "malformed_envelope": (400, "invalid_request_error"),
    "envelope_too_large": (413, "invalid_request_error"),
    "unknown_pool": (404, "not_found_error"),
    QUEUE_FULL: (429, "rate_limit_error"),
    "queue_unavailable": (503, "service_unavailable"),
    "rejected": (503, "service_unavailable"),
    "breaker_open": (503, "service_unavailable"),
    "producer_closed": (503, "service_unavailable"),
    "producer_gone": (503, "service_unavailable"),
    "expired": (504, "timeout"),
    "timeout": (504, "timeout"),
    "deadline_exceeded": (504, "timeout"),
    "backend_connect_error": (502, "api_error"),
    "backend_timeout": (504, "timeout"),
    "backend_http_error": (502, "api_error"),
    "backend_invalid_response": (502, "api_error"),
    "backend_error": (502, "api_error"),
    # The backend failed every attempt transiently: the request waits in its pool's dead letters.
    "dead_lettered": (502, "api_error"),
    "cancelled": (499, "cancelled"),
}


# Error types whose messages the runtime writes from what the client sent or may know (its pools, its
# limits, its time): shown as they are. Every other message may name a backend's or Valkey's address,
# or a web process's host, so the client reads fixed words instead.
SHOWN_ERROR_TYPES = frozenset(
    {
        "invalid_request",
        "malformed_envelope",
        "envelope_too_large",
        "unknown_pool",
        QUEUE_FULL,
        "rejected",
        "expired",
        "timeout",
        "cancelled",
    }
)
_FIXED_MESSAGE: dict[str, str] = {
    "queue_unavailable": "the queue is unavailable; try again shortly",
    "producer_closed": "the ingress is shutting down; try again",
    "producer_gone": "the request was not run (the ingress stalled while it was queued); try again",
    "breaker_open": "the backend is failing and is given time to recover; try again shortly",
    "backend_connect_error": "the backend could not be reached",
    "backend_timeout": "the backend did not answer in time",
    "backend_http_error": "the backend failed",
    "backend_invalid_response": "the backend's answer was not a valid chat completion",
    "backend_error": "the backend failed during the call",
    "dead_lettered": "the backend failed every attempt; the request waits for an operator",
    "deadline_exceeded": "the request's time ran out before the backend answered",
}
_INTERNAL = "internal error"
# A backend's 4xx status -> OpenAI error type (others: invalid_request_error).
_BACKEND_4XX_KIND = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def api_error_for(exc: DispatchError) -> ApiError:
    if isinstance(exc, BackendHTTPError) and exc.status_code:
        return backend_http_error(exc)
    status, kind = _BY_ERROR_TYPE.get(exc.error_type, (500, "api_error"))
    if exc.error_type in SHOWN_ERROR_TYPES:
        message = str(exc)
    else:
        message = _FIXED_MESSAGE.get(exc.error_type, _INTERNAL)
    param = None
    if status == 400 and message.startswith("call."):
        # The envelope speaks of "call.messages[0].role"; the client sent "messages[0].role".
        message = message.removeprefix("call.")
        param = message.split(" ", 1)[0]
    retry_after = getattr(exc, "retry_after_s", None)
    if status == 429 and retry_after is None:
        retry_after = 1.0
    code = exc.error_type
    if isinstance(exc, QueueFull):
        code = _KEY_LIMIT_CODES.get(exc.reason, code)
    return ApiError(status, message, kind, code, param=param, retry_after_s=retry_after)


def backend_http_error(exc: BackendHTTPError) -> ApiError:
    """A backend's failed HTTP answer as the client sees it: its 4xx as is, a 5xx as 502 or 503."""
    said = exc.backend_message
    status = exc.status_code
    if 400 <= status < 500:
        message = said or f"the backend answered HTTP {status}"
        kind = _BACKEND_4XX_KIND.get(status, "invalid_request_error")
        retry_after = exc.retry_after_s
        if status == 429 and retry_after is None:
            retry_after = 1.0
        return ApiError(status, message, kind, exc.error_type, retry_after_s=retry_after)
    if status == 503:
        return ApiError(
            503, "the backend is unavailable (HTTP 503)", "service_unavailable", exc.error_type,
            retry_after_s=exc.retry_after_s,
        )  # fmt: skip
    return ApiError(502, f"the backend failed (HTTP {status})", "api_error", exc.error_type)


def invalid_request(message: str, *, param: str | None = None, code: str = "invalid_request") -> ApiError:
    return ApiError(400, message, "invalid_request_error", code, param=param)
