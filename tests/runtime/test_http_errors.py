"""The one table from lower-layer HTTP failures to the project's error tree (pure: no I/O)."""

from __future__ import annotations

import aiohttp
import httptools
import httpx
import pytest

from runtime.backends.http.errors import ConnectFailed, PoolWaitTimeout, backend_error
from runtime.errors import BackendConnectError, BackendError, BackendTimeout

KEY = aiohttp.client_reqrep.ConnectionKey("h", 1, False, True, None, None, None)


def connect_failed(cause: BaseException) -> ConnectFailed:
    try:
        raise ConnectFailed("could not connect to h:1") from cause
    except ConnectFailed as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "expected", "words"),
    [
        # nothing sent: retryable connect errors
        (
            connect_failed(ConnectionRefusedError(111, "refused")),
            BackendConnectError,
            "ConnectionRefusedError",
        ),
        (connect_failed(TimeoutError()), BackendConnectError, "no connection within 5s"),
        (
            aiohttp.ClientConnectorError(KEY, OSError(111, "refused")),
            BackendConnectError,
            "could not connect",
        ),
        (aiohttp.ConnectionTimeoutError("connect"), BackendConnectError, "no connection within 5s"),
        (httpx.ConnectError("refused"), BackendConnectError, "ConnectError: refused"),
        (httpx.ConnectTimeout("slow"), BackendConnectError, "no connection within 5s"),
        # no free connection in the pool
        (PoolWaitTimeout("busy"), BackendTimeout, "no free connection"),
        (httpx.PoolTimeout("busy"), BackendTimeout, "no free connection"),
        # no answer in time
        (aiohttp.SocketTimeoutError("read"), BackendTimeout, "did not answer within 30s"),
        (TimeoutError(), BackendTimeout, "did not answer"),
        (httpx.ReadTimeout("read"), BackendTimeout, "did not answer"),
        # the request may have reached the backend: not retried
        (httptools.HttpParserError("bad status line"), BackendError, "HttpParserError: bad status line"),
        (ConnectionResetError("server disconnected"), BackendError, "failed mid-call"),
        (aiohttp.ServerDisconnectedError(), BackendError, "failed mid-call"),
        (aiohttp.ClientPayloadError("cut"), BackendError, "failed mid-call"),
        (httpx.RemoteProtocolError("cut"), BackendError, "failed mid-call"),
        (httpx.ReadError("reset"), BackendError, "failed mid-call"),
    ],
)
def test_each_lower_error_has_one_place_in_the_tree(
    exc: BaseException, expected: type[BackendError], words: str
) -> None:
    error = backend_error(exc, "http://b/v1", within_s=30, connect_within_s=5)
    assert type(error) is expected
    assert words in str(error) and "http://b/v1" in str(error)


def test_what_a_lower_layer_quotes_is_scrubbed() -> None:
    exc = OSError("failed http://b/v1?key=sk-secret")
    error = backend_error(
        exc, "http://b/v1", within_s=1, connect_within_s=1, scrub=lambda s: s.replace("sk-secret", "***")
    )
    assert "sk-secret" not in str(error)
