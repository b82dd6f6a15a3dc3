"""ASGI entry point: HTTP through Django, websockets through Channels (served by daphne)."""

import os

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

configure_channel_layers()
# With the embedded chDB history, this process owns the database, so it also runs the ingester.
start_in_background()
# The ingress's producer writes spans too (refusals, withdrawn requests): history shows them like the
# Python producer's. The provider flushes at exit (OpenTelemetry's own atexit hook).
start_tracing("llm-dispatch-ingress")

application = ProtocolTypeRouter(
    {
        # One process serves the demo, so it serves the static files (admin CSS, dashboard JS) too;
        # behind a real web server, run collectstatic and let that server take /static/.
        # The OpenAI-compatible ingress (/v1/) bypasses Django's middleware, sessions and CSRF.
        "http": PathPrefixRouter("/v1/", build_ingress(), ASGIStaticFilesHandler(django_asgi_app)),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
