"""The one way tests wait for something to happen: poll a condition until it holds or a timeout passes.

Tests never sleep a fixed time to let something happen; they wait for the condition they need.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _expired(what: str) -> AssertionError:
    return AssertionError(f"{what} not reached in time")


async def wait_until(
    predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01, what: str = "condition"
) -> T:
    """Polls ``predicate`` on the event loop; returns its first truthy value."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise _expired(what)
        await asyncio.sleep(interval)
    return value


def wait_until_sync(
    predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.05, what: str = "condition"
) -> T:
    """The same for plain threads (subprocess tests, browser tests)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise _expired(what)
        time.sleep(interval)
    return value


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False
