"""The default HTTP client of an endpoint: the lean pool for whole POSTs, aiohttp for streams and proxies.

Why: per call, httpx + httpcore cost ~0.55 ms of CPU at concurrency 16 on the benchmark machine (URL
merging, header models, h11, anyio stream wrappers, pool bookkeeping), more than the rest of the
dispatcher together; aiohttp's C-accelerated HTTP/1.1 client does the same call in ~0.1 ms
(bench/RESULTS.md, issue 13). :class:`BackendHttpClient` has the call shape of ``httpx.AsyncClient``
(``post`` answers a :class:`BodyResponse`, ``stream`` a streaming ``httpx.Response``) so the adapter
holds either (tests inject ``httpx.MockTransport`` through an httpx client). Failures are the lower
layers' own exceptions; :func:`runtime.backends.http.errors.backend_error` translates them once, in
:class:`~runtime.backends.adapter.OpenAIBackend`.

Whole POSTs skip aiohttp's request machinery: they go over a lean HTTP/1.1 pool per origin
(:mod:`runtime.backends.http.pool`, httptools' parser), a third less dispatcher CPU per call again.
Streams, and every request when the environment names a proxy, stay with aiohttp. Headers are checked
(:mod:`runtime.backends.http.headers`) before any of them is written.

Behaviour kept from the httpx client it replaces: keep-alive pool of ``max_connections``, no
redirects followed, no cookies kept, the shared CA bundle, proxies from the environment only when the
environment names one (looking them up per call costs CPU for nothing otherwise).
"""

from __future__ import annotations

import contextlib
import ssl
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Mapping

import aiohttp
import httpx

from runtime.backends.body import BodyResponse
from runtime.backends.http.headers import check_headers
from runtime.backends.http.pool import Http1Pool

# Idle connections are dropped before the 5 s after which uvicorn (vLLM, SGLang, LiteLLM) closes
# them: reusing one the server is closing fails the call (measured: bench_peers against LiteLLM).
KEEPALIVE_S = 4.0
# Distinct timeouts converted to aiohttp's form and kept (callers pass a handful of fixed ones).
TIMEOUTS_KEPT = 16
# Distinct (URL, headers) request heads kept (an adapter calls one URL with fixed headers).
ROUTES_KEPT = 16


def _never_sent(exc: BaseException) -> bool:
    """The request could not be written at all (the pooled connection was already closing)."""
    return isinstance(exc, aiohttp.ClientOSError) and isinstance(
        exc.__cause__, aiohttp.ClientConnectionResetError
    )


class _ResponseStream(httpx.AsyncByteStream):
    """The body of a streamed aiohttp response as httpx reads it (aiohttp's errors pass through)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.content.iter_any():
            yield chunk


class BackendHttpClient:
    """One endpoint's pooled client. The session is made on first use, inside the running loop."""

    def __init__(
        self,
        *,
        timeout_s: float = 120.0,
        connect_timeout_s: float = 5.0,
        max_connections: int = 256,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._default_timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._max_connections = max_connections
        self._ssl_context = ssl_context
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._timeouts: dict[tuple[float | None, ...], aiohttp.ClientTimeout] = {}
        # Whole POSTs go over a lean HTTP/1.1 pool per origin (runtime/backends/http/pool.py), unless the
        # environment names a proxy: aiohttp then handles every request, as it honours proxies.
        self._direct = not urllib.request.getproxies()
        self._origins: dict[tuple[str, int, bool], Http1Pool] = {}
        self._routes: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[Http1Pool, bytes] | None] = {}

    def __repr__(self) -> str:
        connector = self._session.connector if self._session else None
        in_use = len(getattr(connector, "_acquired", ())) if connector else 0
        return f"<BackendHttpClient max_connections={self._max_connections} in_use={in_use}>"

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def origin_pools(self) -> tuple[Http1Pool, ...]:
        """The HTTP/1.1 pool of each origin POSTed to so far, in the order they were first used."""
        return tuple(self._origins.values())

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("BackendHttpClient is closed")
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections,
                limit_per_host=0,
                keepalive_timeout=KEEPALIVE_S,
                ssl=self._ssl_context if self._ssl_context is not None else True,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=bool(urllib.request.getproxies()),
                timeout=aiohttp.ClientTimeout(total=None),
            )
        return self._session

    def _timeout(self, timeout: httpx.Timeout | None) -> aiohttp.ClientTimeout:
        """aiohttp's form of ``timeout``, made once per distinct value: building one costs ~6 µs."""
        timeout = timeout or self._default_timeout
        key = (timeout.pool, timeout.connect, timeout.read)
        converted = self._timeouts.get(key)
        if converted is None:
            if len(self._timeouts) >= TIMEOUTS_KEPT:
                self._timeouts.clear()
            # httpx's pool timeout (waiting for a free connection) is aiohttp's ``connect``.
            converted = self._timeouts[key] = aiohttp.ClientTimeout(
                total=None, connect=timeout.pool, sock_connect=timeout.connect, sock_read=timeout.read
            )
        return converted

    async def post(
        self,
        url: str | httpx.URL,
        *,
        content: bytes,
        headers: Mapping[str, str],
        timeout: httpx.Timeout | None = None,
    ) -> BodyResponse:
        """POST ``content``; the whole body is read before returning."""
        if self._closed:
            raise RuntimeError("BackendHttpClient is closed")
        route = self._route(url, headers) if self._direct else None
        if route is not None:
            pool, head = route
            request = b"%s%d\r\n\r\n%s" % (head, len(content), content)
            timeout = timeout or self._default_timeout
            return await pool.post(request, connect_timeout_s=timeout.connect, pool_timeout_s=timeout.pool)
        check_headers(headers.items())
        session = self._open()
        # A str URL goes to aiohttp as it is; str() of an httpx.URL rebuilds it (~4 µs).
        target = url if isinstance(url, str) else str(url)
        aiohttp_timeout = self._timeout(timeout)
        for attempt in range(2):
            try:
                async with session.post(
                    target, data=content, headers=headers, timeout=aiohttp_timeout, allow_redirects=False
                ) as response:
                    body = await response.read()
                return BodyResponse(response.status, response.headers, body)
            except aiohttp.ClientError as exc:
                # Nothing reached the backend, so once more on a fresh connection is safe.
                if attempt or not _never_sent(exc):
                    raise
        raise AssertionError("unreachable")

    def _route(self, url: str | httpx.URL, headers: Mapping[str, str]) -> tuple[Http1Pool, bytes] | None:
        """The pool of the URL's origin and the request head up to the content length, made once per
        URL and headers; None for what the lean pool does not do (user info in the URL)."""
        key = (str(url), tuple(headers.items()))
        if key in self._routes:
            return self._routes[key]
        parts = urllib.parse.urlsplit(key[0])
        route = None
        if parts.scheme in ("http", "https") and parts.hostname and not parts.username:
            secure = parts.scheme == "https"
            port = parts.port or (443 if secure else 80)
            origin = (parts.hostname, port, secure)
            pool = self._origins.get(origin)
            if pool is None:
                pool = self._origins[origin] = Http1Pool(
                    parts.hostname,
                    port,
                    ssl_context=(self._ssl_context or ssl.create_default_context()) if secure else None,
                    max_connections=self._max_connections,
                    keepalive_s=KEEPALIVE_S,
                )
            check_headers(headers.items())
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            lines = [
                f"POST {path} HTTP/1.1",
                f"host: {parts.netloc}",
                *(f"{k}: {v}" for k, v in headers.items()),
            ]
            route = (pool, ("\r\n".join(lines) + "\r\ncontent-length: ").encode("latin-1"))
        if len(self._routes) >= ROUTES_KEPT:
            self._routes.clear()
        self._routes[key] = route
        return route

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        url: str | httpx.URL,
        *,
        content: bytes,
        headers: Mapping[str, str],
        timeout: httpx.Timeout | None = None,
    ) -> AsyncIterator[httpx.Response]:
        """An ``httpx.Response`` whose body streams from the connection as it arrives."""
        check_headers(headers.items())
        session = self._open()
        request = session.request(
            method,
            str(url),
            data=content,
            headers=headers,
            timeout=self._timeout(timeout),
            allow_redirects=False,
            # httpx decodes the body by its content-encoding header: aiohttp must not do it too.
            auto_decompress=False,
        )
        response = await request.__aenter__()
        try:
            yield httpx.Response(
                response.status, headers=response.raw_headers, stream=_ResponseStream(response)
            )
        finally:
            response.release()

    async def aclose(self) -> None:
        self._closed = True
        for pool in self._origins.values():
            pool.close()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
