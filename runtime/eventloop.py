"""The event loop our own processes run on: uvloop when it is installed, else asyncio's default.

uvloop's loop and transports are written in C; under the dispatcher's load (many short socket reads
and writes per call) it takes a visible share of CPU off each call (bench/RESULTS.md, issue 13).
It is an optional speed-up, never a requirement: without it every entry point runs on asyncio.
Code that runs inside someone else's loop (the async :class:`~runtime.producer.Producer`) does not
choose a loop; only the processes and threads we start do, through these two functions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")

try:
    import uvloop
except ImportError:  # pragma: no cover - exercised where uvloop does not build
    uvloop = None  # type: ignore[assignment]


def loop_name() -> str:
    """``uvloop`` or ``asyncio``: what :func:`run` and :func:`new_event_loop` will use (logged at start)."""
    return "uvloop" if uvloop is not None else "asyncio"


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A fresh loop of the preferred kind, for a thread that runs its own (SyncProducer)."""
    return uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()


def run(coro: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run`` on the preferred loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)
