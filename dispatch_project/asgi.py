"""ASGI entry point: HTTP through Django, websockets through Channels (served by daphne)."""

import os
from typing import Any

from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_project.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from dashboard.routing import websocket_urlpatterns  # noqa: E402
from history.ingester import start_in_background  # noqa: E402
from ingress.build import build_ingress  # noqa: E402
from ingress.routing import PathPrefixRouter  # noqa: E402
from ops.runtime_settings import start_tracing  # noqa: E402
from pools.connections import configure_channel_layers  # noqa: E402


def _with_static_files(app: Any) -> Any:
    """In DEBUG (the demo) this process serves the apps' static files as they are; in production
    WhiteNoise (a middleware, see settings) serves what ``collectstatic`` gathered, under hashed names."""
    return ASGIStaticFilesHandler(app) if settings.DEBUG else app


configure_channel_layers()
# With the embedded chDB history, this process owns the database, so it also runs the ingester.
start_in_background()
# The ingress's producer writes spans too (refusals, withdrawn requests): history shows them like the
# Python producer's. The provider flushes at exit (OpenTelemetry's own atexit hook).
start_tracing("llm-dispatch-ingress")

application = ProtocolTypeRouter(
    {
        # The OpenAI-compatible ingress (/v1/) bypasses Django's middleware, sessions and CSRF.
        "http": PathPrefixRouter("/v1/", build_ingress(), _with_static_files(django_asgi_app)),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
