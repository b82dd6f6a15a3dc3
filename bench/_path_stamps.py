"""Timestamps along each call's path inside one process, for ``bench/probe_c1_path.py``.

:func:`install` wraps a handful of the dispatcher's and the HTTP pool's methods so that each writes
``<event> <time.time()>`` to a file as it runs: no change to the code measured, and a few µs per stamp.
At concurrency 1 the calls do not overlap, so the events between one ``start`` and the next are that
call's (plus the next call's wake-up, and on the wake-token path its round and claim, which happen
before its ``start``). With claim tickets on (the default, :mod:`runtime.dispatch.tickets`) the next
call's request arrives claimed in the dispatcher's inbox: its wake-up leads straight to ``start``.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from statistics import median
from typing import IO, Any

# In the order one call meets them at concurrency 1 (the wake-up and claim of the next call last;
# the wake token may come before FINISH's answer, see :func:`offsets`).
EVENTS = (
    ("start", "the claimed call handed to `_start`"),
    ("execute", "the execute task's first step"),
    ("http_sent", "the backend request written"),
    ("http_answer", "the first bytes of the backend's answer read"),
    ("answered", "the answer parsed (`_call_backend` returns)"),
    ("finish_sent", "FINISH handed to its batcher"),
    ("finish_done", "FINISH answered"),
    ("span", "the span recorded"),
    ("token", "the next call's wake-up read (its request from the ticket's inbox, or a wake token)"),
    ("round", "its scheduling round entered (wake-token path only)"),
    ("claim_sent", "its claim handed to the queue (wake-token path only)"),
    ("claim_done", "its claim answered (wake-token path only)"),
)


def install(path: str) -> None:
    """Stamps the dispatcher process's path to ``path`` (line-buffered, appended)."""
    from runtime.backends.http import pool
    from runtime.dispatch import dispatcher, execution, rounds
    from runtime.queue import dispatching, finishing

    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's whole life
    Dispatcher = dispatcher.Dispatcher
    _wrap(Dispatcher, "_start", "start", out)
    _wrap(Dispatcher, "_woken", "token", out)
    _wrap_async(rounds.Rounds, "schedule_round", out, before="round")
    _wrap_async(execution.Executor, "execute", out, before="execute")
    _wrap_async(execution.Executor, "_call_backend", out, after="answered")
    _wrap_async(finishing.Finishing, "finish", out, before="finish_sent", after="finish_done")
    _wrap_async(dispatching.QueueOps, "claim", out, before="claim_sent", after="claim_done")
    original_record = execution.record_span

    def record_span(*args: Any, **kwargs: Any) -> Any:
        result = original_record(*args, **kwargs)
        out.write(f"span {time.time():.6f}\n")
        return result

    execution.record_span = record_span
    _patch_http(pool, lambda event: out.write(f"{event} {time.time():.6f}\n"))  # for the process's life


@contextlib.contextmanager
def stamp_http(pool: Any, note: Callable[[str], None]) -> Iterator[None]:
    """``http_sent`` as a pooled connection writes a request, ``http_answer`` at its answer's first
    bytes, until the block ends."""
    restore = _patch_http(pool, note)
    try:
        yield
    finally:
        restore()


def _patch_http(pool: Any, note: Callable[[str], None]) -> Callable[[], None]:
    """Stamps the pool's connections (see :func:`stamp_http`); returns what undoes it."""
    connection = pool._Connection
    send, received = connection.send, connection.data_received

    def stamped_send(self: Any, request: bytes) -> Any:
        note("http_sent")
        self.bench_first_read = True
        return send(self, request)

    def stamped_received(self: Any, data: bytes) -> None:
        if getattr(self, "bench_first_read", False):
            self.bench_first_read = False
            note("http_answer")
        received(self, data)

    connection.send, connection.data_received = stamped_send, stamped_received

    def restore() -> None:
        connection.send, connection.data_received = send, received

    return restore


def _wrap(owner: type, name: str, event: str, out: IO[str]) -> None:
    original = getattr(owner, name)

    def stamped(*args: Any, **kwargs: Any) -> Any:
        out.write(f"{event} {time.time():.6f}\n")
        return original(*args, **kwargs)

    setattr(owner, name, stamped)


def _wrap_async(owner: type, name: str, out: IO[str], *, before: str = "", after: str = "") -> None:
    """Stamps ``before`` as the coroutine starts and ``after`` as it returns (either may be empty)."""
    original = getattr(owner, name)

    async def stamped(*args: Any, **kwargs: Any) -> Any:
        if before:
            out.write(f"{before} {time.time():.6f}\n")
        result = await original(*args, **kwargs)
        if after:
            out.write(f"{after} {time.time():.6f}\n")
        return result

    setattr(owner, name, stamped)


# Events that follow their own call's FINISH: with claim tickets the caller's reply (carried by FINISH)
# lets its next push reach this dispatcher's inbox before FINISH's answer is read (two connections
# readable in the same loop turn), so these may come after the next call's ``start``.
AFTER_FINISH = ("finish_done", "span")


def offsets(lines: list[str]) -> tuple[dict[str, float], int, int]:
    """Each event's median time after its call's ``start`` (ms), over the calls that met the most
    common set of events; with how many calls that is, out of how many.

    An event belongs to the call that last started, except FINISH's answer and the span
    (:data:`AFTER_FINISH`): they belong to the call whose FINISH was sent and not yet answered, which
    may be the one before. Medians are taken over calls that met the same set of events, so that
    events that follow one another keep their order."""
    calls: list[dict[str, float]] = []
    for line in lines:
        event, at = line.split()
        if event == "start":
            calls.append({})
        owner = _owner(calls, event)
        if owner is not None:
            owner.setdefault(event, float(at))  # an event met twice (a second claim) keeps its first
    calls = calls[:-1]  # the last call's next wake-up never came
    if not calls:
        return {}, 0, 0
    kinds = Counter(frozenset(call) for call in calls)
    kind, count = kinds.most_common(1)[0]
    typical = [call for call in calls if frozenset(call) == kind]
    result = {event: median([(call[event] - call["start"]) * 1000 for call in typical]) for event in kind}
    return result, count, len(calls)


def _owner(calls: list[dict[str, float]], event: str) -> dict[str, float] | None:
    if event not in AFTER_FINISH:
        return calls[-1] if calls else None
    for call in reversed(calls[-2:]):
        if "finish_sent" in call and event not in call:
            return call
    return None  # before the first stamped call's FINISH: a warm-up call's
