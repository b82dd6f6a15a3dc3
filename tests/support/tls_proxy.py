"""A TLS-terminating reverse proxy for tests, doing what docs/deploy.md asks of nginx in front of daphne.

HTTPS in front (a self-signed certificate made here), plain HTTP and websockets to one upstream, the
client's ``Host`` passed on, ``X-Forwarded-Proto: https`` set on every request (overwriting a
client's), bodies passed through unbuffered and undecoded (WhiteNoise's compressed files stay as sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
     "content-length", "host", "x-forwarded-proto", "x-forwarded-for"}
)  # fmt: skip


def self_signed(directory: Path) -> ssl.SSLContext:
    """A server context with a fresh certificate for 127.0.0.1 (browsers are told to accept it)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    (directory / "proxy.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption())
    )  # fmt: skip
    (directory / "proxy.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(directory / "proxy.crt", directory / "proxy.key")
    return context


def _forwarded(request: web.Request) -> CIMultiDict[str]:
    headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP)
    headers["Host"] = request.host
    headers["X-Forwarded-Proto"] = "https"
    headers["X-Forwarded-For"] = request.remote or ""
    return headers


async def _pump(source: aiohttp.ClientWebSocketResponse | web.WebSocketResponse, sink) -> None:  # type: ignore[no-untyped-def]
    async for message in source:
        if message.type == aiohttp.WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif message.type == aiohttp.WSMsgType.BINARY:
            await sink.send_bytes(message.data)
    await sink.close()


@contextlib.asynccontextmanager
async def tls_proxy(upstream: str, port: int, directory: Path) -> AsyncIterator[str]:
    """Serves https://127.0.0.1:``port`` in front of ``upstream`` (http://host:port); yields its URL."""
    session = aiohttp.ClientSession(auto_decompress=False)

    async def websocket(request: web.Request) -> web.WebSocketResponse:
        server = web.WebSocketResponse()
        await server.prepare(request)
        headers = _forwarded(request)
        for name in ("Sec-WebSocket-Key", "Sec-WebSocket-Version", "Sec-WebSocket-Extensions"):
            headers.popall(name, None)
        async with session.ws_connect(f"{upstream.replace('http', 'ws', 1)}{request.path_qs}",
                                      headers=headers) as client:  # fmt: skip
            await asyncio.gather(_pump(server, client), _pump(client, server))
        return server

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await websocket(request)
        async with session.request(
            request.method, f"{upstream}{request.path_qs}", headers=_forwarded(request),
            data=await request.read(), allow_redirects=False,
        ) as answer:  # fmt: skip
            response = web.StreamResponse(status=answer.status, reason=answer.reason)
            for name, value in answer.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    response.headers.add(name, value)
            await response.prepare(request)
            async for block in answer.content.iter_any():
                await response.write(block)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=self_signed(directory)).start()
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await session.close()
