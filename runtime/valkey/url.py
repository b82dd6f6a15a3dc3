"""The forms ``VALKEY_URL`` takes, read without I/O.

A single server: ``redis://[[user]:password@]host:port/db`` (``rediss://`` for TLS; ``valkey://`` and
``valkeys://`` mean the same), or ``unix:///path/to/socket?db=0``: redis-py reads these itself.

A primary watched by Valkey Sentinel, followed through failovers::

    valkey+sentinel://[[user]:password@]host1:26379,host2:26379,host3:26379/mymaster/0
        [?sentinel_password=...&sentinel_username=...]

The hosts are the sentinels (port 26379 when left out), the first path segment is the master name
the sentinels monitor, the second the database (0 when left out). The userinfo authenticates to the
primary (and its replicas, which become primaries); ``sentinel_password`` to the sentinels, which
usually run without one. ``redis+sentinel://`` is the same; ``valkeys+sentinel://`` and
``rediss+sentinel://`` use TLS for every connection, sentinels included.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from runtime.immutable import immutable

SENTINEL_SCHEMES = {
    "redis+sentinel": False,
    "valkey+sentinel": False,
    "rediss+sentinel": True,
    "valkeys+sentinel": True,
}
# redis-py knows only its own scheme names; Valkey's mean the same protocol.
PLAIN_SCHEMES = {"redis": "redis", "rediss": "rediss", "valkey": "redis", "valkeys": "rediss", "unix": "unix"}
SENTINEL_PORT = 26379
SENTINEL_QUERY = {"sentinel_password", "sentinel_username"}


class InvalidValkeyUrl(ValueError):
    """``VALKEY_URL`` is not a form this project reads; the message never repeats a password."""


@immutable
class SentinelUrl:
    """A primary found through sentinels (see the module docstring)."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    tls: bool = False

    def connection_kwargs(self) -> dict[str, Any]:
        """redis-py's keyword arguments for connections to the primary."""
        kwargs: dict[str, Any] = {"db": self.db}
        if self.password is not None:
            kwargs.update(username=self.username, password=self.password)
        if self.tls:
            kwargs["ssl"] = True
        return kwargs

    def sentinel_kwargs(self) -> dict[str, Any]:
        """redis-py's keyword arguments for connections to the sentinels."""
        kwargs: dict[str, Any] = {}
        if self.sentinel_password is not None:
            kwargs.update(username=self.sentinel_username, password=self.sentinel_password)
        if self.tls:
            kwargs["ssl"] = True
        return kwargs


def parse_sentinel(url: str) -> SentinelUrl | None:
    """The sentinel form of ``url``, None for a single-server URL; InvalidValkeyUrl for neither."""
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep or (scheme not in SENTINEL_SCHEMES and scheme not in PLAIN_SCHEMES):
        known = ", ".join(f"{name}://" for name in [*PLAIN_SCHEMES, *SENTINEL_SCHEMES])
        raise InvalidValkeyUrl(f"VALKEY_URL must start with one of {known}; got {redact(url)!r}")
    if scheme not in SENTINEL_SCHEMES:
        return None
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, password = _credentials(userinfo)
    path = [segment for segment in parts.path.split("/") if segment]
    if not path or len(path) > 2:
        raise InvalidValkeyUrl(
            "a sentinel VALKEY_URL names the master and optionally the db: .../mymaster/0; "
            f"got {redact(url)!r}"
        )
    query = {key: values[-1] for key, values in parse_qs(parts.query, keep_blank_values=True).items()}
    unknown = set(query) - SENTINEL_QUERY
    if unknown:
        raise InvalidValkeyUrl(
            f"unknown VALKEY_URL option(s) {sorted(unknown)}; known: {sorted(SENTINEL_QUERY)}"
        )
    return SentinelUrl(
        sentinels=tuple(_address(host, url) for host in hosts.split(",")),
        master_name=unquote(path[0]),
        db=_db(path[1] if len(path) > 1 else "0", url),
        username=username,
        password=password,
        sentinel_username=query.get("sentinel_username") or None,
        sentinel_password=query.get("sentinel_password"),
        tls=SENTINEL_SCHEMES[scheme],
    )


def redis_py_url(url: str) -> str:
    """A single-server URL as redis-py's ``from_url`` reads it (``valkey://`` becomes ``redis://``)."""
    scheme, sep, rest = url.partition("://")
    return f"{PLAIN_SCHEMES.get(scheme.lower(), scheme)}{sep}{rest}"


def redact(url: str) -> str:
    """``url`` without its passwords, for logs and the dashboard."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unreadable URL>"
    netloc = parts.netloc.rpartition("@")[2] if "@" in parts.netloc else parts.netloc
    query = "&".join(
        f"{key}=***" if key.endswith("password") else f"{key}={value[-1]}"
        for key, value in parse_qs(parts.query, keep_blank_values=True).items()
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    if not userinfo:
        return None, None
    user, colon, password = userinfo.partition(":")
    if not colon:  # "password@host" is how redis-py's users often write it; so is ":password@"
        return None, unquote(user)
    return (unquote(user) or None), unquote(password)


def _address(host: str, url: str) -> tuple[str, int]:
    host = host.strip()
    if host.startswith("["):  # [::1]:26379
        name, _, rest = host[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        name, _, port = host.rpartition(":") if ":" in host else (host, "", "")
    if not name:
        raise InvalidValkeyUrl(f"a sentinel in VALKEY_URL has no host: {redact(url)!r}")
    try:
        number = int(port) if port else SENTINEL_PORT
    except ValueError:
        raise InvalidValkeyUrl(f"sentinel port {port!r} in VALKEY_URL is not a number") from None
    if not 0 < number < 65536:
        raise InvalidValkeyUrl(f"sentinel port {number} in VALKEY_URL is out of range")
    return name, number


def _db(text: str, url: str) -> int:
    if not text.isdigit():
        raise InvalidValkeyUrl(
            f"the db in a sentinel VALKEY_URL is a number; got {text!r} in {redact(url)!r}"
        )
    return int(text)
