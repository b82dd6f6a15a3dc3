"""The one exception tree of LLM Dispatch.

Every error that can reach a producer, a reply or a history row is one of these. Each class carries
a stable ``error_type`` string: replies, counters and ClickHouse rows use that string, and
:func:`error_from_type` turns it back into the class on the producer side.

    DispatchError
    ├── ContractError                  bad input; never retried
    │   ├── MalformedEnvelope          bytes that do not decode into the wire contract
    │   ├── EnvelopeTooLarge           refused at submit: over the configured size limit
    │   └── UnknownPool                the group has no such pool
    ├── BackendError                   the OpenAI-compatible backend failed
    │   ├── BackendConnectError        retryable: could not connect
    │   ├── BackendTimeout             retryable: no answer in time
    │   ├── BackendHTTPError           non-2xx; retryable for 408/409/429/5xx
    │   ├── BackendInvalidResponse     2xx whose body is not a chat completion
    │   ├── InvalidHeader              a key or header that would write lines of its own (CR/LF,
    │   │                              NUL) or a name that is not a token: refused before sending
    │   └── BreakerOpen                retryable: the backend's circuit breaker refused the call
    ├── QueueUnavailable               retryable: Valkey cannot be reached
    ├── RequestTimeout                 the producer gave up waiting for its reply
    ├── RequestExpired                 the deadline passed before the request left its queue
    ├── ProducerGone                   retryable: not run, the producer's liveness marker had lapsed
    │                                  when a dispatcher took it off its queue
    ├── DeadLettered                   attempts (or requeues) exhausted: parked for an operator
    ├── DeadlineExceeded               the caller's deadline cut the backend call short (not the
    │                                  backend's fault: never a breaker event)
    ├── ProducerClosed                 submit on a closed producer, or closed while waiting
    ├── Cancelled                      the producer withdrew the request (its caller went away)
    ├── StreamInterrupted              a streamed call's attempt ended after chunks reached the
    │                                  producer (its dispatcher died or shut down): never run again
    └── Rejected                       refused by policy (queueing disabled, admission control)
        └── QueueFull                  refused at submit by the pool's admission limits; nothing queued

Lower layers' exceptions are translated at the edge with ``raise ... from exc``.
"""

from __future__ import annotations


class DispatchError(Exception):
    """Base of every LLM Dispatch error."""

    error_type: str = "dispatch_error"
    retryable: bool = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message or self.__class__.__doc__ or self.error_type

    def __str__(self) -> str:
        return self.message


class ContractError(DispatchError):
    """Input that breaks the wire contract."""

    error_type = "invalid_request"


class MalformedEnvelope(ContractError):
    """Bytes that do not decode into a valid envelope or reply."""

    error_type = "malformed_envelope"


class EnvelopeTooLarge(ContractError):
    """An envelope over the configured size limit, refused at submit."""

    error_type = "envelope_too_large"


class UnknownPool(ContractError):
    """A pool id that the fabric group does not have."""

    error_type = "unknown_pool"


class BackendError(DispatchError):
    """The OpenAI-compatible backend failed."""

    error_type = "backend_error"


class BackendConnectError(BackendError):
    """The backend could not be reached."""

    error_type = "backend_connect_error"
    retryable = True


class BackendTimeout(BackendError):
    """The backend did not answer in time."""

    error_type = "backend_timeout"
    retryable = True


class BackendHTTPError(BackendError):
    """The backend answered with a non-2xx status."""

    error_type = "backend_http_error"

    def __init__(
        self,
        message: str = "",
        *,
        status_code: int = 0,
        retry_after_s: float | None = None,
        backend_message: str = "",
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        # The backend's Retry-After in seconds (429/503), honoured by the retry decision.
        self.retry_after_s = retry_after_s
        # The backend's own words, without its address: what an API client may be shown.
        self.backend_message = backend_message
        self.retryable = status_code in (408, 409, 429) or status_code >= 500


class BackendInvalidResponse(BackendError):
    """A 2xx answer whose body is not a chat completion."""

    error_type = "backend_invalid_response"


class InvalidHeader(BackendError, ValueError):
    """A header name that is not an HTTP token, or a value (an API key) with CR, LF or NUL in it:
    refused before anything is sent, as it would write headers of its own. Configuration, not the
    backend's state: never retried, never a breaker event."""

    error_type = "invalid_header"


class BreakerOpen(BackendError):
    """The backend's circuit breaker is open: it failed repeatedly and is given time to recover."""

    error_type = "breaker_open"
    retryable = True


class QueueUnavailable(DispatchError):
    """Valkey cannot be reached."""

    error_type = "queue_unavailable"
    retryable = True


class RequestTimeout(DispatchError):
    """The producer's timeout passed before its reply arrived."""

    error_type = "timeout"


class RequestExpired(DispatchError):
    """The request's deadline passed before it left its queue; it was not executed."""

    error_type = "expired"


class ProducerGone(DispatchError):
    """The request was not run: its producer's liveness marker had lapsed when a dispatcher took it off
    its queue (the producer stalled, or its refresh came late), so it was dropped as ``producer_gone``.
    It never reached a backend: submitting it again is safe."""

    error_type = "producer_gone"
    retryable = True


class DeadLettered(DispatchError):
    """The request used up its attempts (or its requeues in durable mode) and waits in its pool's
    dead-letter list for an operator to replay or discard it."""

    error_type = "dead_lettered"


class DeadlineExceeded(DispatchError):
    """The call ran out of the caller's time: its deadline, shorter than the backend timeout, passed."""

    error_type = "deadline_exceeded"


class ProducerClosed(DispatchError):
    """The producer was closed."""

    error_type = "producer_closed"


class Cancelled(DispatchError):
    """The producer withdrew the request: queued ones are never executed, running ones are cut off."""

    error_type = "cancelled"


class StreamInterrupted(DispatchError):
    """A streamed call stopped after some of its chunks reached the producer: its dispatcher died
    (lease expired) or shut down. It is not run again: a second attempt would repeat or mix chunks."""

    error_type = "stream_interrupted"


class Rejected(DispatchError):
    """Refused by policy: queueing disabled, admission control."""

    error_type = "rejected"


class QueueFull(Rejected):
    """The pool's admission limits refused the request at submit; nothing was queued.

    ``reason`` is ``max_queued`` or ``max_queue_wait``; ``depth`` the queue length seen, ``limit`` the
    limit hit, ``retry_after_s`` a hint for when to try again (the ingress sends it as Retry-After).
    """

    error_type = "queue_full"
    retryable = True

    def __init__(
        self,
        message: str = "",
        *,
        pool_id: str = "",
        reason: str = "",
        depth: int = 0,
        limit: float = 0.0,
        retry_after_s: float = 1.0,
    ) -> None:
        super().__init__(message)
        self.pool_id = pool_id
        self.reason = reason
        self.depth = depth
        self.limit = limit
        self.retry_after_s = retry_after_s


def _all_subclasses(cls: type[DispatchError]) -> list[type[DispatchError]]:
    found = [cls]
    for sub in cls.__subclasses__():
        found.extend(_all_subclasses(sub))
    return found


ERROR_TYPES: dict[str, type[DispatchError]] = {c.error_type: c for c in _all_subclasses(DispatchError)}


def error_from_type(
    error_type: str,
    message: str,
    *,
    status_code: int | None = None,
    retry_after_s: float | None = None,
    backend_message: str = "",
) -> DispatchError:
    """Rebuild the typed exception a reply describes; unknown types become the base class.

    A backend's HTTP status, Retry-After and own message come back on a :class:`BackendHTTPError`.
    """
    cls = ERROR_TYPES.get(error_type, DispatchError)
    error: DispatchError
    if cls is BackendHTTPError:
        error = BackendHTTPError(
            message,
            status_code=status_code or 0,
            retry_after_s=retry_after_s,
            backend_message=backend_message,
        )
    else:
        error = cls(message)
    if error.error_type != error_type:
        error.error_type = error_type
    return error
