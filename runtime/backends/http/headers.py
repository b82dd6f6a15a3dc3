"""Header names and values checked before a request head is written.

Why: the lean pool writes a request head as bytes, so a value holding CR/LF (an API key pasted with a
line break, a header from a configuration row) would end its line and write headers, or a second
request, of its own. aiohttp and httpx refuse such values too; the lean pool refuses them here, once
per distinct set of headers (heads are cached), with an error that names the header and not its value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from runtime.errors import InvalidHeader

# RFC 9110 section 5.6.2: a field name is a token.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# RFC 9110 section 5.5: a field value is visible characters, spaces and tabs; CR, LF and NUL are what
# an injection needs, the other control characters make servers (llhttp) refuse the request.
_FORBIDDEN_IN_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def check_header(name: str, value: str) -> None:
    """Raises :class:`InvalidHeader` for a name that is not a token or a value with a control
    character (CR, LF, NUL...; a tab is allowed)."""
    if not _TOKEN.fullmatch(name):
        raise InvalidHeader(f"header name {name!r} is not an HTTP token: refused before sending")
    if _FORBIDDEN_IN_VALUE.search(value):
        # The value is not quoted back: it is often a credential.
        raise InvalidHeader(
            f"header {name!r} has a control character (CR, LF, NUL...) in its value: refused before sending"
        )


def check_headers(headers: Iterable[tuple[str, str]]) -> None:
    for name, value in headers:
        check_header(name, value)
