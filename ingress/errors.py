"""Errors in OpenAI's JSON shape, with the status codes the OpenAI SDKs map to their exception classes.

Pure: :func:`api_error_for` turns one of :mod:`runtime.errors` into an :class:`ApiError`; the ingress
writes it. 400 ``BadRequestError``, 401 ``AuthenticationError``, 403 ``PermissionDeniedError``, 404
``NotFoundError``, 413 ``APIStatusError``, 429 ``RateLimitError``, 5xx ``InternalServerError``.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from runtime.errors import DispatchError

# Admission control (queue full) arrives with its own issue; its error_type is mapped here already.
QUEUE_FULL = "queue_full"


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
    "expired": (504, "timeout"),
    "timeout": (504, "timeout"),
    "backend_connect_error": (502, "api_error"),
    "backend_timeout": (504, "timeout"),
    "backend_http_error": (502, "api_error"),
    "backend_invalid_response": (502, "api_error"),
    "backend_error": (502, "api_error"),
    "cancelled": (499, "cancelled"),
}


def api_error_for(exc: DispatchError) -> ApiError:
    status, kind = _BY_ERROR_TYPE.get(exc.error_type, (500, "api_error"))
    message = str(exc)
    param = None
    if status == 400 and message.startswith("call."):
        # The envelope speaks of "call.messages[0].role"; the client sent "messages[0].role".
        message = message.removeprefix("call.")
        param = message.split(" ", 1)[0]
    retry_after = getattr(exc, "retry_after_s", None)
    if status == 429 and retry_after is None:
        retry_after = 1.0
    return ApiError(status, message, kind, exc.error_type, param=param, retry_after_s=retry_after)


def invalid_request(message: str, *, param: str | None = None, code: str = "invalid_request") -> ApiError:
    return ApiError(400, message, "invalid_request_error", code, param=param)
