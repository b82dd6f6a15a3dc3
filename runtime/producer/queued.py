"""A queued submit: push the envelope, wait for the reply the pump hands over, withdraw on cancel.

A part of :class:`~runtime.producer.core.Producer` (the streamed call's counterpart is
:mod:`~runtime.producer.streams`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from opentelemetry import trace

from runtime.errors import RequestTimeout
from runtime.producer.outcomes import CompletionResult, reply_error, withdrawn_span
from runtime.producer.pump import Waiter
from runtime.producer.tenancy import UNTAGGED_TAG, TenantTag
from runtime.queue.admission import KeyLease
from runtime.wire.contract import Call, Metadata, Reply

if TYPE_CHECKING:
    from runtime.producer.core import Producer

__all__ = ["submit_queued"]


async def submit_queued(
    producer: Producer,
    chat: Call,
    request_id: str,
    pool_id: str,
    metadata: Metadata,
    timeout_s: float,
    span: trace.Span,
    lease: KeyLease | None = None,
    tag: TenantTag = UNTAGGED_TAG,
) -> CompletionResult:
    """Pushes one call to ``pool_id`` and returns its answer; raises its typed error or RequestTimeout."""
    loop = asyncio.get_running_loop()
    # Counted from before the envelope's deadline is set, not from the end of the push: the caller
    # gives up no later than the deadline the dispatcher bounds the call by, so a dispatcher that runs
    # into it answers after this timer (a late reply), never first (it did by the push's duration).
    expires_at = loop.time() + timeout_s
    enqueue = producer._enqueue
    raw = enqueue.envelope(chat, request_id, pool_id, metadata, timeout_s, span, tenant=tag.tenant)
    future: asyncio.Future[Reply] = loop.create_future()
    waiters = producer._waiters
    waiters[request_id] = Waiter(future, pool_id)
    # A timer on the reply's own future rather than asyncio.wait_for, which adds a second future,
    # done callbacks and its own timer to every submit.
    timer = loop.call_at(expires_at, _expire, future)
    try:
        await enqueue.push(pool_id, request_id, raw, lease, timeout_s, tag)
        try:
            reply = await future
        except TimeoutError:
            producer.stats.timed_out += 1
            raise RequestTimeout(
                f"request {request_id} to pool {pool_id!r} got no reply within {timeout_s:g}s"
            ) from None
    except asyncio.CancelledError:
        # Cancelled while the push was on its way too: the push was written, so the withdrawal that
        # follows it on the connection finds the request queued (it was left behind before).
        if await producer.withdraw(pool_id, request_id, raw, tag):
            withdrawn_span(span)
        raise
    finally:
        timer.cancel()
        waiters.pop(request_id, None)
        if lease is not None:
            await enqueue.key_leases.release(lease)
    if not reply.ok:
        raise reply_error(reply)
    assert reply.completion is not None
    return CompletionResult(request_id, pool_id, reply.completion, reply.timing)


def _expire(future: asyncio.Future[Reply]) -> None:
    """A submit's timer: its reply did not come in time (a reply arriving later is counted late)."""
    if not future.done():
        future.set_exception(TimeoutError())
