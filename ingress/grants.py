"""A short-lived cache of producer-key grants, so the hot path does not query the database per call.

A revoked key is refused within ``ttl_s`` (one second by default) in every web process. Callers that
miss at the same moment (every open connection when a key's entry lapses) share one lookup.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from ingress.selectors import KeyGrant

MAX_ENTRIES = 10_000


class GrantCache:
    def __init__(
        self,
        lookup: Callable[[str], Awaitable[KeyGrant | None]],
        *,
        ttl_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lookup = lookup
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: dict[str, tuple[float, KeyGrant | None]] = {}
        self._pending: dict[str, asyncio.Task[KeyGrant | None]] = {}

    def __repr__(self) -> str:
        return f"<GrantCache entries={len(self._entries)} ttl_s={self.ttl_s}>"

    async def get(self, raw_key: str) -> KeyGrant | None:
        """The key's grant; unknown and revoked keys (None) are cached too, so guessing costs no query."""
        now = self.clock()
        cached = self._entries.get(raw_key)
        if cached is not None and now - cached[0] < self.ttl_s:
            return cached[1]
        pending = self._pending.get(raw_key)
        if pending is None:
            pending = self._pending[raw_key] = asyncio.ensure_future(self._refresh(raw_key, now))
        # Shielded: a caller whose client goes away does not cancel the lookup the others wait for.
        return await asyncio.shield(pending)

    async def _refresh(self, raw_key: str, now: float) -> KeyGrant | None:
        try:
            grant = await self.lookup(raw_key)
        finally:
            del self._pending[raw_key]
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.clear()
        self._entries[raw_key] = (now, grant)
        return grant
