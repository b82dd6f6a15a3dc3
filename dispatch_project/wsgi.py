"""WSGI entry point (HTTP only; the dashboard's websocket needs the ASGI app)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_project.settings")
application = get_wsgi_application()
