"""The HTTP edge of the dispatcher: one endpoint's client, its lean pool, header checks, and the one
translation of HTTP failures into :mod:`runtime.errors`."""

from runtime.backends.http.client import BackendHttpClient
from runtime.backends.http.errors import backend_error
from runtime.backends.http.headers import check_headers
from runtime.backends.http.pool import Http1Pool

__all__ = ["BackendHttpClient", "Http1Pool", "backend_error", "check_headers"]
