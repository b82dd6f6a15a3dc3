"""A real Valkey server frozen (SIGSTOP) for a block, as a network partition looks to its clients."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

from runtime.valkey import embedded


@contextlib.contextmanager
def stopped(server: embedded.EmbeddedValkey) -> Iterator[float]:
    """The server frozen (SIGSTOP) for the block; yields the monotonic time it stopped. Always resumed,
    so a failing test leaves no frozen server behind (SIGTERM waits on a stopped process)."""
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield time.monotonic()
    finally:
        os.kill(server.pid, signal.SIGCONT)
