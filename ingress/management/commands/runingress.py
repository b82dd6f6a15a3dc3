"""``manage.py runingress``: serve the OpenAI-compatible ``/v1`` ingress on uvicorn (uvloop, httptools).

Its own process kind beside the web process (daphne), which keeps the dashboard, the admin and the
websockets. Each process (each worker) is one producer.
"""

from __future__ import annotations

import importlib.util
import socket
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

APP = "ingress.asgi:application"
# Streams still open at SIGTERM get this long, then are cut off (and their calls withdrawn); below the
# unit's TimeoutStopSec.
GRACEFUL_SHUTDOWN_S = 10


class Command(BaseCommand):
    # Like daphne, no system checks at start: a pool without a backend (an error there) is answered per
    # call with 503, and must not keep the ingress of every other pool down.
    requires_system_checks: list[str] = []
    help = (
        "Serve the OpenAI-compatible /v1 ingress (chat completions, models) on uvicorn with uvloop and "
        "httptools, until SIGTERM/SIGINT. Each worker process is one producer."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
        parser.add_argument("--port", type=int, default=8001, help="port to bind (default: %(default)s)")
        parser.add_argument(
            "--workers",
            type=int,
            default=1,
            help="worker processes sharing the port, about one per core (default: %(default)s)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        import uvicorn

        from ingress.protocol import HeadWithBodyProtocol

        host, port, workers = options["host"], options["port"], options["workers"]
        if not 0 < port < 65536:
            raise CommandError(f"--port must be between 1 and 65535, got {port}")
        if workers < 1:
            raise CommandError(f"--workers must be at least 1, got {workers}")
        problem = bind_problem(host, port)
        if problem:
            raise CommandError(f"cannot serve on {host}:{port}: {problem}; pass another --host or --port")
        self.stdout.write(f"ingress on http://{host}:{port}/v1 ({workers} worker{'s' * (workers > 1)})")
        uvicorn.run(
            APP,
            host=host,
            port=port,
            workers=workers,
            loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
            # httptools', sending each response's head in one write with its first body bytes.
            http=HeadWithBodyProtocol,
            ws="none",
            lifespan="on",
            access_log=False,
            # Django's LOGGING (DISPATCH_LOG_LEVEL) holds the root handler; uvicorn's loggers go there.
            log_config=None,
            server_header=False,
            # The ingress reads neither the client's address nor the scheme: rewriting them from
            # X-Forwarded-* headers is work per request for nothing.
            proxy_headers=False,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )


def bind_problem(host: str, port: int) -> str:
    """Why ``host:port`` cannot be bound (a taken port, an address not on this host), or ""."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"unknown host ({exc.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return ""
