"""The one way tests wait for something to happen: poll a condition until it holds or a timeout passes.

Tests never sleep a fixed time to let something happen; they wait for the condition they need. The
few sleeps left in tests are the scenario itself (a server that stays down, a clock that must move on)
and say so in a comment.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _expired(what: str) -> AssertionError:
    return AssertionError(f"{what} not reached in time")


async def wait_until(
    predicate: Callable[[], T | Awaitable[T]],
    timeout: float = 10.0,
    interval: float = 0.01,
    what: str = "condition",
) -> T:
    """Polls ``predicate`` on the event loop; returns its first truthy value.

    ``predicate`` may be a coroutine function (one that reads Valkey, a page, a /metrics scrape).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise _expired(what)
        await asyncio.sleep(interval)


async def wait_until_equal(
    read: Callable[[], Awaitable[Any]], expected: Any, timeout: float = 10.0, what: str = "value"
) -> None:
    """Polls an async ``read`` (e.g. ``lambda: client.llen(queue)``) until it returns ``expected``."""
    seen: list[Any] = []

    async def reached() -> bool:
        seen[:] = [await read()]
        return bool(seen[0] == expected)

    try:
        await wait_until(reached, timeout, what=what)
    except AssertionError:
        raise AssertionError(f"{what} never became {expected!r} (last: {seen[0]!r})") from None


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


def wait_for_start(
    ready: Callable[[], T],
    proc: subprocess.Popen[Any] | None = None,
    what: str = "start-up",
    interval: float = 0.05,
) -> T:
    """Waits for the readiness signal a process or thread gives (a line it printed, a key or a read it
    made in Valkey, an answer on its port); returns the first truthy value of ``ready``.

    Start-up (Django, chDB, OpenTelemetry imports, a schema migration) costs seconds of CPU, so on a
    busy machine its wall time is whatever CPU the machine hands out: a fixed deadline here measures
    the load, not the code, and fails a correct test. So there is no deadline of its own: the test's
    timeout (pytest-timeout) bounds it, and ``proc`` exiting first fails it at once with its exit code.
    The deadlines of the behaviour under test start when this returns.
    """
    while not (value := ready()):
        _check_running(proc, what)
        time.sleep(interval)
    return value


async def started(
    ready: Callable[[], T | Awaitable[T]],
    proc: subprocess.Popen[Any] | None = None,
    what: str = "start-up",
    interval: float = 0.05,
) -> T:
    """:func:`wait_for_start` on the event loop; ``ready`` may be a coroutine function."""
    while True:
        value = ready()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        _check_running(proc, what)
        await asyncio.sleep(interval)


def _check_running(proc: subprocess.Popen[Any] | None, what: str) -> None:
    if proc is not None and proc.poll() is not None:
        raise AssertionError(f"{what}: {proc.args} exited with {proc.returncode} before it was ready")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Waits until ``proc`` listens on ``port``; fails at once, with its exit code, if it exits first."""

    def listening() -> bool:
        assert proc.poll() is None, f"{proc.args} exited with {proc.returncode}"
        return port_open(port)

    wait_until_sync(listening, timeout, interval=0.1, what=f"a listener on port {port}")
