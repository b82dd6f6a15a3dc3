"""The ingress's HTTP/1.1 protocol on uvicorn: httptools' own, with each response's head sent in the
same write as its first body bytes.

Why: uvicorn writes the status line and headers when the app sends ``http.response.start`` and the
body when it sends ``http.response.body``: two system calls and two TCP segments for every answer (and
for a stream's first chunk). On loopback each segment wakes the client, which then reads the head
alone and waits again for the body: one more wakeup and read on the client's side per call, and one
more send on ours (bench/RESULTS.md, issue 23 session 7). ASGI cannot say "these two go together",
so the head is held back here until the next write of its response, or until the end of the loop turn
it was written in (an app that sends its head and then waits still has it sent at once).

Everything else is uvicorn's ``HttpToolsProtocol`` as it is.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

__all__ = ["HeadHeldTransport", "HeadWithBodyProtocol"]


class HeadHeldTransport:
    """A connection's transport as one response cycle sees it: its head (the cycle's first write once
    its response started) waits for the cycle's next write or for the end of this loop turn."""

    __slots__ = ("_cycle", "_held", "_loop", "_transport", "writes")

    def __init__(
        self, transport: asyncio.Transport, cycle: RequestResponseCycle, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._transport = transport
        # Until its head is seen (None after): the cycle holds this transport, and a reference back
        # for the cycle's whole life made every request (its cycle, scope, headers, body, event: ~14
        # objects) garbage that only the cyclic GC frees, a young collection every ~40 requests and an
        # older one every ~400 (bench/RESULTS.md, issue 23 session 11).
        self._cycle: RequestResponseCycle | None = cycle
        self._loop = loop
        self._held: bytes | None = None
        self.writes = 0  # system writes asked of the transport for this cycle

    def __repr__(self) -> str:
        return f"<HeadHeldTransport writes={self.writes} holding={self._held is not None}>"

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._cycle is not None and self._cycle.response_started:
            # uvicorn flags the response started right before it writes the head: this is the head.
            # (A "100 Continue" is written before that, and goes out at once.)
            self._cycle = None
            self._held = bytes(data)
            self._loop.call_soon(self._release)
            return
        held, self._held = self._held, None
        self._write(held + data if held is not None else data)

    def _release(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._write(held)

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes += 1
        self._transport.write(data)

    def close(self) -> None:
        self._release()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class HeadWithBodyProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol whose response cycles write through a :class:`HeadHeldTransport`."""

    def on_headers_complete(self) -> None:
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        # A new cycle's task was created but has not run: nothing is written yet.
        if cycle is not None and cycle is not before and not cycle.response_started:
            cycle.transport = HeadHeldTransport(self.transport, cycle, self.loop)  # type: ignore[assignment]
