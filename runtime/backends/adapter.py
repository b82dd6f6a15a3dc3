"""The OpenAI-compatible backend adapter: send one normalized call, classify the outcome.

:class:`OpenAIBackend` POSTs the request body untouched to ``{base_url}/chat/completions`` (or the
call's own endpoint: ``/embeddings``, ``/completions``) and maps every failure onto
:mod:`runtime.errors` at this edge (transport failures through the one table,
:func:`runtime.backends.http.errors.backend_error`):

* could not connect (refused, DNS, connect timeout)  -> :class:`BackendConnectError`
* read / write / pool timeout, or the call's overall time budget ran out -> :class:`BackendTimeout`
* non-2xx -> :class:`BackendHTTPError` (with the provider's ``error.message`` when it sent one)
* 2xx whose body is not JSON or has no ``choices`` list (``data`` for embeddings) ->
  :class:`BackendInvalidResponse`
* the connection broke after the request was sent -> :class:`BackendError` (not retried: the
  backend may have run the call)

Credentials: a URL's ``user:password@`` part is never sent in the URL (httpx would turn it into Basic
auth) and never shown. When such a URL comes without an explicit ``api_key``, its password (or, when
there is no password, its username) is used as the bearer token. Messages and :attr:`display_url` use
:func:`runtime.backends.redact.redact_url`, which also masks secret-looking query parameters.

:class:`BackendPool` keeps one pooled client per endpoint (a
:class:`~runtime.backends.http.client.BackendHttpClient`), shared by every request (and every API key)
sent to it. A key or header that would write a line of its own (CR, LF, NUL: any control character
but the tab) is refused when the backend is made (:class:`~runtime.errors.InvalidHeader`), before
anything is sent.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import orjson

from runtime.backends.answers import (
    SNIPPET,
    Answer,
    Completion,
    Usage,
    parse_retry_after,
    parse_usage,
    provider_message,
)
from runtime.backends.http.client import BackendHttpClient
from runtime.backends.http.errors import LOWER_ERRORS, PoolWaitTimeout, backend_error
from runtime.backends.http.headers import check_headers
from runtime.backends.redact import redact_url, scrub_address, strip_userinfo, userinfo_secret
from runtime.errors import (
    BackendError,
    BackendHTTPError,
    BackendInvalidResponse,
    BackendTimeout,
)
from runtime.wire.call import CHAT_COMPLETIONS, EMBEDDINGS, ENDPOINT_PATHS

__all__ = [
    "Answer",
    "BackendPool",
    "Completion",
    "OpenAIBackend",
    "Usage",
    "make_client",
    "parse_retry_after",
    "parse_usage",
    "provider_message",
]


def _chat_url(base_url: str, endpoint: str = CHAT_COMPLETIONS) -> str:
    """``{base_url}/chat/completions`` (or ``endpoint``'s path) with userinfo removed and the query
    string kept."""
    url = httpx.URL(strip_userinfo(base_url))
    return str(url.copy_with(path=url.path.rstrip("/") + ENDPOINT_PATHS[endpoint]))


# What a 2xx body must hold to be the endpoint's answer.
_ANSWER_LISTS = {endpoint: "choices" for endpoint in ENDPOINT_PATHS} | {EMBEDDINGS: "data"}
_ANSWER_NAMES = {CHAT_COMPLETIONS: "a chat completion", EMBEDDINGS: "an embeddings list"}


class OpenAIBackend:
    """One OpenAI-compatible endpoint. Safe to share between concurrent calls."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        connect_timeout_s: float = 5.0,
        max_connections: int = 256,
        pool_timeout_s: float | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        client: EndpointClient | None = None,
    ) -> None:
        """``client``, when given, is shared and not closed by :meth:`aclose` (BackendPool uses it).
        ``pool_timeout_s`` bounds a call's wait for a free connection (None: only its budget does)."""
        if timeout_s <= 0 or connect_timeout_s <= 0 or (pool_timeout_s is not None and pool_timeout_s <= 0):
            raise ValueError("timeout_s, connect_timeout_s and pool_timeout_s must be > 0")
        self.display_url = redact_url(base_url)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.pool_timeout_s = pool_timeout_s
        # Parsed once: httpx re-parses a str URL on every request.
        self._urls = {endpoint: httpx.URL(_chat_url(base_url, endpoint)) for endpoint in ENDPOINT_PATHS}
        key = api_key if api_key is not None else userinfo_secret(base_url)
        self._base_url = base_url
        self._secrets = (key,) if key else ()
        self._headers = {"content-type": "application/json", "accept": "application/json"}
        if key:
            self._headers["authorization"] = f"Bearer {key}"
        check_headers(self._headers.items())
        self._stream_headers = {**self._headers, "accept": "text/event-stream"}
        self._owns_client = client is None
        self._client = client or make_client(
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            max_connections=max_connections,
            transport=transport,
        )
        # httpx wants its parsed URL (it re-parses a str per request); aiohttp takes the str as is.
        self._request_urls: dict[str, str | httpx.URL] = {
            endpoint: url if isinstance(self._client, httpx.AsyncClient) else str(url)
            for endpoint, url in self._urls.items()
        }
        self._request_url = self._request_urls[CHAT_COMPLETIONS]  # the chat one, as tests read it
        # A streamed call is bounded per read here (its caller bounds the whole stream).
        self._stream_timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s, pool=pool_timeout_s)
        # A whole call is bounded by its budget in complete(); only the connect phase has its own
        # timeout (it tells a backend that cannot be reached apart from a slow one). No read timeout
        # also spares aiohttp re-arming a timer on every chunk it receives.
        self._call_timeout = httpx.Timeout(None, connect=connect_timeout_s, pool=pool_timeout_s)

    def __repr__(self) -> str:
        return f"<OpenAIBackend {self.display_url} timeout_s={self.timeout_s}>"

    async def complete(
        self, body: Mapping[str, Any], *, timeout_s: float | None = None, endpoint: str = CHAT_COMPLETIONS
    ) -> Completion:
        """POST the call to ``endpoint`` (chat completions by default); ``timeout_s`` bounds the whole
        call (capped by the default)."""
        budget = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        if budget <= 0:
            raise BackendTimeout(f"no time left to call backend {self.display_url}")
        content = orjson.dumps(body)
        timeout = (
            self._call_timeout
            if budget >= self.connect_timeout_s
            else httpx.Timeout(None, connect=budget, pool=self.pool_timeout_s)
        )
        bound = asyncio.timeout(budget)
        try:
            async with bound:
                response = await self._client.post(
                    self._request_urls[endpoint], content=content, headers=self._headers, timeout=timeout
                )
        except LOWER_ERRORS as exc:
            if bound.expired():
                raise BackendTimeout(
                    f"backend {self.display_url} did not answer within {budget:.3g}s"
                ) from exc
            raise self._transport_error(exc, budget) from exc
        return self._completion(response, endpoint)

    async def stream(
        self, body: Mapping[str, Any], *, endpoint: str = CHAT_COMPLETIONS
    ) -> AsyncIterator[dict[str, Any]]:
        """POST the call with ``stream: true`` to ``endpoint``; yields each SSE chunk object until
        ``data: [DONE]``.

        The caller bounds the whole stream (``asyncio.timeout`` around its loop); each read here is
        bounded by the backend's timeout. Failures are translated like :meth:`complete`'s.
        """
        content = orjson.dumps({**body, "stream": True})
        try:
            async with self._client.stream(
                "POST",
                self._request_urls[endpoint],
                content=content,
                headers=self._stream_headers,
                timeout=self._stream_timeout,
            ) as response:
                if not 200 <= response.status_code < 300:
                    await response.aread()
                    self._completion(response)  # raises, with the provider's message and Retry-After
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    yield self._chunk(data, response.status_code)
        except LOWER_ERRORS as exc:
            raise self._transport_error(exc, self.timeout_s) from exc

    def _chunk(self, data: str, status: int) -> dict[str, Any]:
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise BackendInvalidResponse(
                f"backend {self.display_url} streamed an event that is not JSON: {data[:SNIPPET]!r}"
            ) from exc
        if not isinstance(chunk, dict):
            raise BackendInvalidResponse(f"backend {self.display_url} streamed a chunk that is not an object")
        if isinstance(chunk.get("error"), dict):
            said = provider_message(data.encode())
            raise BackendHTTPError(
                f"backend {self.display_url} failed mid-stream: {said}",
                status_code=status,
                backend_message=self._public(said),
            )
        return chunk

    def _transport_error(self, exc: BaseException, budget: float) -> BackendError:
        within = self.pool_timeout_s if isinstance(exc, httpx.PoolTimeout | PoolWaitTimeout) else budget
        return backend_error(
            exc,
            self.display_url,
            within_s=within or budget,
            connect_within_s=self.connect_timeout_s,
            scrub=self._scrub,
        )

    def _public(self, said: str) -> str:
        """The backend's message as an API client may see it: its own address and our key masked."""
        return scrub_address(said, self._base_url, self._secrets)

    def _scrub(self, text: str) -> str:
        """Lower layers may quote the request URL, whose query can hold a key: show it redacted."""
        for parsed in self._urls.values():
            url = str(parsed)
            text = text.replace(url, redact_url(url))
        return text

    def _completion(self, response: Answer, endpoint: str = CHAT_COMPLETIONS) -> Completion:
        status = response.status_code
        if not 200 <= status < 300:
            said = provider_message(response.content)
            raise BackendHTTPError(
                f"backend {self.display_url} answered HTTP {status}: {said}",
                status_code=status,
                retry_after_s=parse_retry_after(response.headers.get("retry-after")),
                backend_message=self._public(said),
            )
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            snippet = response.content[:SNIPPET].decode("utf-8", "replace")
            raise BackendInvalidResponse(
                f"backend {self.display_url} answered HTTP {status} with a body that is not JSON: {snippet!r}"
            ) from exc
        wanted = _ANSWER_LISTS[endpoint]
        if not isinstance(body, dict) or not isinstance(body.get(wanted), list):
            raise BackendInvalidResponse(
                f"backend {self.display_url} answered HTTP {status} with JSON that is not "
                f"{_ANSWER_NAMES.get(endpoint, 'a completion')} (no {wanted!r} list)"
            )
        model = body.get("model")
        usage = parse_usage(body)
        if endpoint == EMBEDDINGS and usage is not None and usage.output_tokens is None:
            usage = Usage(usage.input_tokens, 0, usage.total_tokens)  # an embedding generates nothing
        return Completion(
            body=body,
            usage=usage,
            status_code=status,
            model=model if isinstance(model, str) else None,
        )

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()


EndpointClient = httpx.AsyncClient | BackendHttpClient


def make_client(
    *,
    timeout_s: float = 120.0,
    connect_timeout_s: float = 5.0,
    max_connections: int = 256,
    transport: httpx.AsyncBaseTransport | None = None,
) -> EndpointClient:
    """The pooled client used for one endpoint: keep-alive, no redirects, no cookies kept between calls.

    A :class:`BackendHttpClient` (a fifth of httpx's CPU per call), unless a ``transport`` is given
    (tests inject ``httpx.MockTransport``): then one httpx client over that transport.
    """
    if transport is None:
        return BackendHttpClient(
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            max_connections=max_connections,
            ssl_context=_shared_ssl_context(),
        )
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        transport=transport,
        follow_redirects=False,
    )


_SSL_CONTEXT: ssl.SSLContext | None = None


def _shared_ssl_context() -> ssl.SSLContext:
    """httpx's default context (certifi's CA bundle), made once: loading the bundle takes ~25 ms."""
    global _SSL_CONTEXT
    if _SSL_CONTEXT is None:
        _SSL_CONTEXT = httpx.create_ssl_context()
    return _SSL_CONTEXT


_POOL_KWARGS = frozenset({"timeout_s", "connect_timeout_s", "pool_timeout_s", "max_connections", "transport"})


class BackendPool:
    """One pooled client per endpoint URL, shared by all requests (and all API keys) sent to it."""

    def __init__(self, *, api_keys: Mapping[str, str | None] | None = None, **backend_kwargs: Any) -> None:
        unknown = set(backend_kwargs) - _POOL_KWARGS
        if unknown:
            raise TypeError(
                f"unknown BackendPool options: {sorted(unknown)}; allowed: {sorted(_POOL_KWARGS)}"
            )
        self._api_keys = dict(api_keys or {})
        self._backend_kwargs = backend_kwargs
        self._clients: dict[str, EndpointClient] = {}
        self._backends: dict[tuple[str, str | None, float | None, float | None], OpenAIBackend] = {}

    def get(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
    ) -> OpenAIBackend:
        """The backend for ``base_url``; the key defaults to ``api_keys[base_url]``, then URL userinfo.
        ``timeout_s`` / ``connect_timeout_s`` are a backend row's own (None: the pool's defaults); calls
        with other timeouts still share the endpoint's connections."""
        if api_key is None:
            api_key = self._api_keys.get(base_url)
        wanted = (base_url, api_key, timeout_s, connect_timeout_s)
        backend = self._backends.get(wanted)
        if backend is not None:
            return backend
        endpoint = _chat_url(base_url)
        client = self._clients.get(endpoint)
        if client is None:
            client = self._clients[endpoint] = make_client(**self._client_kwargs())
        options = self._backend_only_kwargs()
        if timeout_s is not None:
            options["timeout_s"] = timeout_s
        if connect_timeout_s is not None:
            options["connect_timeout_s"] = connect_timeout_s
        backend = OpenAIBackend(base_url, api_key=api_key, client=client, **options)
        self._backends[wanted] = backend
        return backend

    def _client_kwargs(self) -> dict[str, Any]:
        return {k: v for k, v in self._backend_kwargs.items() if k != "pool_timeout_s"}

    def _backend_only_kwargs(self) -> dict[str, Any]:
        keys = ("timeout_s", "connect_timeout_s", "pool_timeout_s")
        return {k: v for k, v in self._backend_kwargs.items() if k in keys}

    def __repr__(self) -> str:
        urls = sorted({b.display_url for b in self._backends.values()})
        return f"<BackendPool clients={len(self._clients)} endpoints={urls}>"

    async def aclose(self) -> None:
        clients, self._clients, self._backends = list(self._clients.values()), {}, {}
        for client in clients:
            await client.aclose()
