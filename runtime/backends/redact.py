"""Strip credentials from backend URLs before they are shown, logged or stored.

Backend URLs come from operators and may carry secrets two ways: userinfo (``https://user:pw@host``)
and query parameters (``?api_key=...``). :func:`redact_url` removes the first and masks the second;
:func:`url_has_credentials` tells the admin to refuse such a URL and ask for a separate key instead.
Both never raise: a URL that does not parse is reduced to a fixed placeholder rather than echoed.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus, urlsplit, urlunsplit

MASK = "***"
UNPARSEABLE = "<unparseable url>"

# A query parameter is secret when one of the words of its name (split on anything that is not a
# letter or digit, case-insensitive) is in this set: ``api_key``, ``X-Amz-Signature``, ``access_token``
# and ``apikey`` are secret; ``api-version`` and ``keyword`` are not.
SECRET_WORDS = frozenset(
    {
        "key",
        "apikey",
        "token",
        "secret",
        "password",
        "passwd",
        "pwd",
        "sig",
        "signature",
        "auth",
        "authorization",
        "credential",
        "credentials",
    }
)
_WORD_SPLIT = re.compile(r"[^a-z0-9]+")


def is_secret_param(name: str) -> bool:
    """True when a query parameter name looks like it carries a secret."""
    words = _WORD_SPLIT.split(unquote_plus(name).lower())
    return any(word in SECRET_WORDS for word in words)


def _split_netloc(netloc: str) -> tuple[str, str]:
    """Return (userinfo, hostport); userinfo is '' when absent."""
    userinfo, sep, hostport = netloc.rpartition("@")
    return (userinfo, hostport) if sep else ("", netloc)


def _mask_query(query: str) -> str:
    if not query:
        return query
    parts = []
    for item in query.split("&"):
        name, sep, value = item.partition("=")
        if sep and value and is_secret_param(name):
            item = f"{name}={MASK}"
        parts.append(item)
    return "&".join(parts)


def _has_secret_query(query: str) -> bool:
    for item in query.split("&"):
        name, sep, value = item.partition("=")
        if sep and value and is_secret_param(name):
            return True
    return False


def strip_userinfo(url: str) -> str:
    """The URL without its ``user:password@`` part, everything else untouched (used to send requests)."""
    parts = urlsplit(url)
    _, hostport = _split_netloc(parts.netloc)
    return urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment))


def userinfo_secret(url: str) -> str | None:
    """The secret embedded in the URL's userinfo: the password, or the username when there is none."""
    parts = urlsplit(url)
    userinfo, _ = _split_netloc(parts.netloc)
    if not userinfo:
        return None
    user, _, password = userinfo.partition(":")
    secret = unquote_plus(password or user)
    return secret or None


def redact_url(url: str) -> str:
    """The URL safe to display: userinfo removed, secret-looking query and fragment values masked."""
    try:
        parts = urlsplit(url)
        _, hostport = _split_netloc(parts.netloc)
        return urlunsplit(
            (parts.scheme, hostport, parts.path, _mask_query(parts.query), _mask_query(parts.fragment))
        )
    except ValueError:
        return UNPARSEABLE


def scrub_address(text: str, url: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` (a backend's own message) with that backend's URL, host and ``secrets`` masked: an API
    client may read what the backend said, never where it lives or which key it was called with."""
    try:
        parts = urlsplit(url)
        hostport = _split_netloc(parts.netloc)[1]
        host = parts.hostname or ""
    except ValueError:
        hostport = host = ""
    words = (url, strip_userinfo(url) if hostport else "", hostport, host, *secrets)
    # Longest first: the URL before its host, so a mask never leaves half an address behind.
    for word in sorted({w for w in words if w}, key=len, reverse=True):
        text = text.replace(word, MASK)
    return text


def url_has_credentials(url: str) -> bool:
    """True when the URL embeds a secret (userinfo, or a secret-looking query parameter with a value).

    A URL that does not parse counts as having credentials: the caller should refuse it either way.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return True
    userinfo, _ = _split_netloc(parts.netloc)
    return bool(userinfo) or _has_secret_query(parts.query) or _has_secret_query(parts.fragment)
