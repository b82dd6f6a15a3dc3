"""The whole answer of a backend call, as every client of the adapter returns it."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["BodyResponse"]


class BodyResponse:
    """A whole answer as the adapter reads it: ``status_code``, ``headers`` and ``content``, like httpx's.

    Why not an ``httpx.Response``: building one (header model, byte stream, read) cost ~4 % of the
    dispatcher's CPU per call, and the old one was built without headers, which lost ``Retry-After``.
    ``headers``: aiohttp's case-insensitive view, or the lean pool's dict of lower-case names.
    """

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: Mapping[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    def __repr__(self) -> str:
        return f"<BodyResponse [{self.status_code}] {len(self.content)} bytes>"
