"""Where a plain script finds the installation's Valkey, by the same rule as every ``manage.py`` command.

``VALKEY_URL`` when it is set; otherwise the embedded server that the demo (or any command) started
and recorded in ``valkey.json`` under the data directory (``DISPATCH_DATA_DIR``, default ``var/`` of
the checkout). Unlike the commands, a script never starts a server: with no dispatcher behind it, a
fresh Valkey would only hold its requests forever.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from runtime.valkey.embedded import EmbeddedValkeyError, running
from runtime.valkey.url import parse_sentinel

# The checkout's var/ directory; dispatch_project.settings uses the same default.
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "var"


def installation_url(environ: Mapping[str, str]) -> str:
    """The Valkey URL of this installation, from ``environ`` (pass ``os.environ``).

    Raises EmbeddedValkeyError, naming the data directory, when no URL is set and no embedded server
    is running there; InvalidValkeyUrl when the URL is none of the forms of :mod:`runtime.valkey.url`
    (a server's, or the sentinel form).
    """
    url = environ.get("VALKEY_URL", "").strip()
    if url:
        parse_sentinel(url)  # refuses a form no client here could open, before a script uses it
        return url
    data_dir = Path(environ.get("DISPATCH_DATA_DIR", "").strip() or DEFAULT_DATA_DIR).resolve()
    server = running(data_dir)
    if server is None:
        raise EmbeddedValkeyError(
            f"VALKEY_URL is not set and no embedded Valkey is running under {data_dir}; "
            "start the demo (bash scripts/demo.sh) or set VALKEY_URL"
        )
    return server.url
