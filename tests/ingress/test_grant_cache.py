"""The key cache shares one lookup between callers that miss together, and a gone caller cancels none."""

from __future__ import annotations

import asyncio

import pytest

from ingress.grants import GrantCache
from ingress.selectors import KeyGrant

GRANT = KeyGrant(1, "alice", frozenset({"gold"}), "gold", None, None)


class SlowLookup:
    """A lookup that answers when the test releases it, counting calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()

    async def __call__(self, raw_key: str) -> KeyGrant | None:
        self.calls += 1
        await self.release.wait()
        return GRANT if raw_key == "k" else None


async def test_callers_that_miss_together_share_one_lookup() -> None:
    lookup = SlowLookup()
    cache = GrantCache(lookup, ttl_s=1.0, clock=lambda: 0.0)
    waiting = [asyncio.ensure_future(cache.get("k")) for _ in range(16)]
    other = asyncio.ensure_future(cache.get("unknown"))
    await asyncio.sleep(0)  # every caller reaches the lookup
    lookup.release.set()
    assert await asyncio.gather(*waiting) == [GRANT] * 16
    assert await other is None
    assert lookup.calls == 2  # one per key, not one per caller
    assert await cache.get("k") == GRANT and lookup.calls == 2  # then cached


async def test_a_cancelled_caller_does_not_cancel_the_shared_lookup() -> None:
    lookup = SlowLookup()
    cache = GrantCache(lookup, ttl_s=1.0, clock=lambda: 0.0)
    first = asyncio.ensure_future(cache.get("k"))
    second = asyncio.ensure_future(cache.get("k"))
    await asyncio.sleep(0)
    first.cancel()  # its client went away
    lookup.release.set()
    assert await second == GRANT
    with pytest.raises(asyncio.CancelledError):
        await first
    assert lookup.calls == 1


async def test_a_failed_lookup_reaches_every_caller_and_the_next_one_retries() -> None:
    calls: list[str] = []

    async def failing(raw_key: str) -> KeyGrant | None:
        calls.append(raw_key)
        await asyncio.sleep(0)
        if len(calls) == 1:
            raise OSError("database down")
        return GRANT

    cache = GrantCache(failing, ttl_s=1.0, clock=lambda: 0.0)
    results = await asyncio.gather(cache.get("k"), cache.get("k"), return_exceptions=True)
    assert [type(r) for r in results] == [OSError, OSError] and len(calls) == 1
    assert await cache.get("k") == GRANT and len(calls) == 2
