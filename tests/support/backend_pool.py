"""A backend HTTP pool opened for one test and closed after it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from runtime.backends.adapter import BackendPool


@contextlib.asynccontextmanager
async def open_pool() -> AsyncIterator[BackendPool]:
    pool = BackendPool(timeout_s=10)
    try:
        yield pool
    finally:
        await pool.aclose()
