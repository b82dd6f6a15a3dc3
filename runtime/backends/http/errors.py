"""The one translation of HTTP failures into :mod:`runtime.errors`.

The lower layers raise what they raise: the lean pool httptools' ``HttpParserError``, ``OSError``,
``TimeoutError`` (and :class:`ConnectFailed` / :class:`PoolWaitTimeout` where only the phase tells
the failure apart), aiohttp its ``ClientError`` tree, an injected httpx transport httpx's. The adapter
catches :data:`LOWER_ERRORS` and calls :func:`backend_error` once, with ``raise ... from exc``:

* nothing was sent (refused, DNS, connect timeout)             -> ``BackendConnectError`` (retryable)
* no free connection within the pool timeout                    -> ``BackendTimeout``
* no answer in time (read / write timeout)                      -> ``BackendTimeout``
* anything after the request may have reached the backend      -> ``BackendError`` (not retried)
"""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import httptools
import httpx

from runtime.errors import BackendConnectError, BackendError, BackendTimeout


class ConnectFailed(Exception):
    """The lean pool could not open a connection; ``__cause__`` is the ``OSError``/``TimeoutError``."""


class PoolWaitTimeout(TimeoutError):
    """No connection of the lean pool came free within the pool timeout."""


LOWER_ERRORS = (
    httpx.HTTPError,
    aiohttp.ClientError,
    httptools.HttpParserError,
    OSError,
    TimeoutError,
    ConnectFailed,
)

_CONNECT = (
    ConnectFailed,
    httpx.ConnectError,
    httpx.ConnectTimeout,
    aiohttp.ClientConnectorError,
    aiohttp.ConnectionTimeoutError,
)
_POOL = (PoolWaitTimeout, httpx.PoolTimeout)
# aiohttp's ServerTimeoutError (socket read, connect) is a TimeoutError already.
_TIMEOUT = (TimeoutError, httpx.TimeoutException)


def backend_error(
    exc: BaseException,
    where: str,
    *,
    within_s: float,
    connect_within_s: float,
    scrub: Callable[[str], str] = str,
) -> BackendError:
    """The project's error for ``exc`` raised while calling backend ``where`` (its redacted URL).

    ``within_s`` is the call's budget, ``connect_within_s`` the connect phase's; ``scrub`` hides what a
    lower layer's message may quote (the request URL with a key in its query).
    """
    kind = type(exc).__name__
    cause = exc.__cause__ if isinstance(exc, ConnectFailed) and exc.__cause__ is not None else exc
    if isinstance(exc, _POOL):
        return BackendTimeout(f"no free connection to backend {where} within {within_s:.3g}s ({kind})")
    if isinstance(exc, _CONNECT):
        if isinstance(cause, _TIMEOUT):
            return BackendConnectError(
                f"could not connect to backend {where}: no connection within "
                f"{min(within_s, connect_within_s):.3g}s ({type(cause).__name__})"
            )
        said = scrub(str(cause) or type(cause).__name__)
        return BackendConnectError(f"could not connect to backend {where}: {type(cause).__name__}: {said}")
    if isinstance(exc, _TIMEOUT):
        return BackendTimeout(f"backend {where} did not answer within {within_s:.3g}s ({kind})")
    said = scrub(str(exc) or kind)
    return BackendError(f"backend {where} failed mid-call: {kind}: {said}")
