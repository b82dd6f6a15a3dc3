"""Servers on an event loop of their own, in a thread of this process.

A server in the test's own event loop answers only when the test's coroutines let it: on a loaded
machine a burst of the test's own work (a flood of submits, their replies) can hold a scrape of the
server's ``/metrics`` past its budget. On a thread, the server answers within the interpreter's switch
interval whatever the test's loop is doing, and its state can still be read directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from simulator.server import SimulatorConfig, SimulatorServer

_T = TypeVar("_T")
START_S = 20.0


class LoopThread:
    """An event loop running in a daemon thread; :meth:`run` waits for a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)

    def run(self, coroutine: Coroutine[Any, Any, _T], timeout_s: float = START_S) -> _T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)


@contextlib.contextmanager
def loop_thread() -> Iterator[LoopThread]:
    """A loop in a thread of its own for the block; stopped and closed after it."""
    runner = LoopThread()
    runner.thread.start()
    try:
        yield runner
    finally:
        runner.loop.call_soon_threadsafe(runner.loop.stop)
        runner.thread.join(10)
        runner.loop.close()


@contextlib.contextmanager
def simulator_thread(config: SimulatorConfig | None = None) -> Iterator[SimulatorServer]:
    """The simulator serving from a loop of its own (see the module docstring)."""
    with loop_thread() as runner:
        sim = SimulatorServer(config)
        runner.run(sim.start())
        try:
            yield sim
        finally:
            runner.run(sim.stop())
