"""Running one claimed request to its end: the backend call, the reply, the lease, the span.

The call is bounded by the request's deadline; its endpoint's circuit breaker slot was taken when it
was claimed, and every path here either reports the call's outcome to the breaker or gives the slot
back. A call cut short by the caller's deadline ends as ``deadline_exceeded``, which is not the
backend's failure. The reply goes out only if the producer is still alive (one atomic script that
also releases the lease); every outcome is counted and recorded as a span. Nothing here decides
*what* runs: that is the scheduler's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from opentelemetry import trace

from runtime.backends.adapter import BackendPool, Completion, OpenAIBackend
from runtime.backends.fleet import BackendFleet
from runtime.backends.redact import redact_url
from runtime.backoff import Backoff
from runtime.config import DispatcherSettings
from runtime.dispatch import redelivery, tenant_round
from runtime.dispatch.stats import (
    DROP_REPLY_PRODUCER_GONE,
    DROP_REPLY_UNDELIVERED,
    DROP_STALE_ATTEMPT,
    DispatcherStats,
)
from runtime.dispatch.streaming import Fence, StreamRelay, StreamSummary, stream_timeout
from runtime.errors import (
    BackendHTTPError,
    BackendTimeout,
    Cancelled,
    DeadLettered,
    DeadlineExceeded,
    DispatchError,
    Rejected,
    RequestExpired,
    StreamInterrupted,
)
from runtime.queue import scripts
from runtime.queue.dispatching import QueueOps
from runtime.queue.leases import LeaseRecord
from runtime.telemetry.spans import Identity, Outcome, content_attributes, record_span
from runtime.valkey.client import REDIS_ERRORS
from runtime.wire.contract import STATUS_ERROR, STATUS_OK, BackendAnswer, Envelope, Reply, Timing
from runtime.wire.groupconfig import GroupConfig

log = logging.getLogger(__name__)
# Endpoints are few and their redacted form never changes: parse each once, not once per call.
_shown_url = functools.lru_cache(maxsize=64)(redact_url)
FINISH_ATTEMPTS = 5
FINISH_UNDELIVERED = -2  # Valkey failed on every try: the reply (or retry) is lost, and counted
# A failure this close to the request's deadline was cut short by it: never retried.
DEADLINE_SLACK_S = 0.05
# A cancel can beat its call (claimed, call not started yet): such ids are kept this long, this many.
EARLY_CANCEL_S = 30.0
EARLY_CANCELS_MAX = 1024
_T = TypeVar("_T")


@dataclass(slots=True)
class Running:
    """One request this dispatcher is executing."""

    envelope: Envelope
    pool_id: str
    member: str
    cost: int
    started_at: float
    stage: str = "executing"
    token: str = ""  # the claim's fencing token (durable mode); "" when unfenced
    backend_id: str = ""  # the backend row the call goes to ("" for a bare endpoint URL)


class Executor:
    """Executes claimed requests for one dispatcher; shares its counters, breakers and backends."""

    def __init__(
        self,
        *,
        queue: QueueOps,
        settings: DispatcherSettings,
        backends: BackendPool,
        breakers: BackendFleet,
        stats: DispatcherStats,
        tracer: trace.Tracer,
        identity: Identity,
        secrets: Mapping[str, str],
        store_content: bool,
        on_valkey_error: Callable[[BaseException], None],
    ) -> None:
        self.queue = queue
        self.settings = settings
        self.backends = backends
        self.breakers = breakers
        self.stats = stats
        self.tracer = tracer
        self.identity = identity
        self.secrets = secrets
        self.store_content = store_content
        self.on_valkey_error = on_valkey_error
        self._calls: dict[str, asyncio.Future[Any]] = {}
        self._early_cancels: dict[str, float] = {}
        self._group_pools_of: tuple[GroupConfig | None, tuple[str, ...]] = (None, ())
        self.relay = StreamRelay(
            queue.client, queue.keys, reply_ttl_s=settings.reply_ttl_s, group_id=queue.group_id
        )

    def cancel(self, request_id: str) -> bool:
        """Cuts off the backend call of a request whose producer withdrew it; False if none runs here."""
        call = self._calls.get(request_id)
        if call is not None:
            return call.cancel()
        # Every dispatcher of the group hears every cancel, so most of these ids never run here.
        now = time.monotonic()
        if len(self._early_cancels) >= EARLY_CANCELS_MAX:
            self._early_cancels = {r: t for r, t in self._early_cancels.items() if now - t < EARLY_CANCEL_S}
        if len(self._early_cancels) < EARLY_CANCELS_MAX:
            self._early_cancels[request_id] = now
        return False

    async def execute(self, run: Running, config: GroupConfig, refused: DispatchError | None = None) -> None:
        """Calls the backend, replies, releases the lease and records the span; never raises.

        With ``refused`` the backend is not called: the producer gets that error as its reply (a
        claimed request the dispatcher could not start still gets an explicit answer).
        """
        envelope = run.envelope
        endpoint = config.endpoint_for(run.pool_id)
        started = time.time()
        completion: Completion | None = None
        error: DispatchError | None = refused
        summary = StreamSummary() if envelope.stream is not None else None
        shutdown: redelivery.Settlement | None = None
        try:
            if refused is None:
                fence = self._fence(run) if summary is not None else None
                completion = await self._call_backend(
                    envelope, endpoint, config, summary, run.backend_id, fence
                )
            else:
                await self.breakers.release(run.backend_id, endpoint)
        except DispatchError as exc:
            error = exc
        except asyncio.CancelledError:
            error, shutdown = self._cut_by_shutdown(run, summary)
        except Exception as exc:  # a bug must still answer the producer and free the slot
            log.exception("unexpected error executing request %s", envelope.request_id)
            error = DispatchError(f"internal dispatcher error: {exc}")
        ended = time.time()
        run.stage = "replying"
        timing = Timing(
            max(0.0, started - envelope.enqueued_at), ended - started, max(0.0, ended - envelope.enqueued_at)
        )
        settled = shutdown or (self._settle(run, config, error, ended, timing) if refused is None else None)
        reply = settled.reply if settled is not None else self._reply(envelope, completion, error, timing)
        code = await self._finish(run, reply, self._group_pools(config), settled)
        if self.queue.charges:  # a fair pool's call: its usage corrects its tenant's charge (issue 22)
            await tenant_round.correct(self.queue, run.member, completion, config.pool(run.pool_id))
        self._count(code, error, settled)
        self._record(run, endpoint, completion, error, started, ended, code, summary, settled)

    def _fence(self, run: Running) -> Fence:
        """What a streamed attempt relays under; in durable mode, the lease record its first chunk stores."""
        if not run.token:
            return Fence(run.member)
        record = LeaseRecord.of(
            run.envelope, pool_id=run.pool_id, claimed_at=run.started_at,
            dispatcher_id=self.identity.dispatcher_id, cost=run.cost,
        )  # fmt: skip
        return Fence(run.member, run.token, dataclasses.replace(record, streamed=True).encode())

    @staticmethod
    def _cut_by_shutdown(
        run: Running, summary: StreamSummary | None
    ) -> tuple[DispatchError, redelivery.Settlement | None]:
        """A call still running when the grace period ended: a durable one goes back to the head of its
        pool (nothing of it reached the producer yet); a stream that did send chunks ends as
        ``stream_interrupted``; any other is answered ``rejected``."""
        request_id = run.envelope.request_id
        if summary is not None and summary.relayed:
            return StreamInterrupted(
                f"request {request_id}: the dispatcher shut down after {summary.relayed} chunk(s) were sent"
            ), None
        if run.token:
            error = Rejected(
                f"request {request_id}: the dispatcher shut down before the call finished; queued again"
            )
            payload = redelivery.requeued(run.envelope).encode()
            return error, redelivery.Settlement(scripts.SETTLE_REQUEUE, payload=payload, error=error)
        return Rejected("the dispatcher shut down before the call finished"), None

    def _group_pools(self, config: GroupConfig) -> tuple[str, ...]:
        """The ids of the group's enabled pools, worked out once per published configuration."""
        if self._group_pools_of[0] is not config:
            self._group_pools_of = (config, tuple(p.pool_id for p in config.enabled_pools))
        return self._group_pools_of[1]

    def _settle(
        self, run: Running, config: GroupConfig, error: DispatchError | None, ended: float, timing: Timing
    ) -> redelivery.Settlement | None:
        """A retry or a dead letter for a transient failure in a pool that retries; None to just reply."""
        if error is None:
            return None
        pool = config.pool(run.pool_id)
        if pool is None:
            return None
        deadline = run.envelope.deadline
        # A call that ran into the caller's deadline was cut short by it, whatever the error says.
        cut = deadline is not None and ended >= deadline - DEADLINE_SLACK_S
        return redelivery.settle_failure(
            run.envelope, error, pool.retry_policy(), now=ended, timing=timing, cut_by_deadline=cut
        )

    def _count(self, code: int, error: DispatchError | None, settled: redelivery.Settlement | None) -> None:
        if code == scripts.FINISH_STALE:
            self.stats.dropped[DROP_STALE_ATTEMPT] += 1
            return
        if code == scripts.FINISH_PRODUCER_GONE:
            self.stats.dropped[DROP_REPLY_PRODUCER_GONE] += 1
        if code == FINISH_UNDELIVERED:
            self.stats.dropped[DROP_REPLY_UNDELIVERED] += 1
        if settled is not None and settled.kind == scripts.SETTLE_RETRY:
            self.stats.retried += 1
        elif settled is not None and settled.kind == scripts.SETTLE_REQUEUE:
            self.stats.requeued += 1
        elif settled is not None:
            self.stats.dead_lettered += 1
            self.stats.failed[DeadLettered.error_type] += 1
        elif error is None:
            self.stats.completed += 1
        else:
            self.stats.failed[error.error_type] += 1

    def _reply(
        self, envelope: Envelope, completion: Completion | None, error: DispatchError | None, timing: Timing
    ) -> bytes:
        if error is None and completion is not None:
            return Reply(envelope.request_id, STATUS_OK, completion=completion.body, timing=timing).encode()
        assert error is not None
        return Reply(
            envelope.request_id,
            STATUS_ERROR,
            error_type=error.error_type,
            error_message=str(error),
            timing=timing,
            backend=backend_answer(error),
        ).encode()

    async def _call_backend(
        self,
        envelope: Envelope,
        endpoint: str,
        config: GroupConfig,
        summary: StreamSummary | None = None,
        backend_id: str = "",
        fence: Fence | None = None,
    ) -> Completion:
        reported = False
        row = config.backend(backend_id) if backend_id else None
        try:
            timeout = self.settings.backend_timeout_s
            if row is not None:
                timeout = min(timeout, row.timeout_s)
            cut_by_deadline = False
            if envelope.deadline is not None:
                left = envelope.deadline - time.time()
                if left <= 0:
                    raise RequestExpired(f"request {envelope.request_id} expired before its call started")
                timeout, cut_by_deadline = min(timeout, left), left < timeout
            if not endpoint:
                raise Rejected(f"fabric group {config.group_id} has no endpoint for pool {envelope.pool_id}")
            key_env = row.api_key_env if row is not None else config.api_key_env
            api_key = self.secrets.get(key_env) if key_env else None
            # The row's connect timeout tells a backend that cannot be reached from a slow one.
            backend = self.backends.get(
                endpoint, api_key, connect_timeout_s=row.connect_timeout_s if row is not None else None
            )
            try:
                call = (
                    self._stream(backend, envelope, timeout, summary, fence or Fence())
                    if summary is not None
                    else backend.complete(envelope.call.to_openai(), timeout_s=timeout)
                )
                completion = await self._cancellable(envelope.request_id, call)
            except DispatchError as exc:
                if cut_by_deadline and isinstance(exc, BackendTimeout):
                    raise DeadlineExceeded(
                        f"request {envelope.request_id}: the caller's deadline passed after "
                        f"{timeout:.3g}s, before {redact_url(endpoint)} answered"
                    ) from exc
                if isinstance(exc, Cancelled):  # the producer withdrew it: nothing learnt of the backend
                    raise
                reported = True
                await self.breakers.record(backend_id, endpoint, exc)
                raise
            reported = True
            await self.breakers.record(backend_id, endpoint, None)
            return completion
        finally:
            if not reported:  # no outcome that says anything about the backend: free the breaker slot
                await self.breakers.release(backend_id, endpoint)

    async def _stream(
        self, backend: OpenAIBackend, envelope: Envelope, timeout: float, summary: StreamSummary, fence: Fence
    ) -> Completion:
        try:
            async with asyncio.timeout(timeout):
                return await self.relay.run(
                    backend, envelope, started_at=time.time(), summary=summary, fence=fence
                )
        except TimeoutError:
            raise stream_timeout(timeout, backend.display_url) from None

    async def _cancellable(self, request_id: str, call: Coroutine[Any, Any, _T]) -> _T:
        """Runs the backend call as a task :meth:`cancel` can cut off, telling that apart from shutdown."""
        if self._early_cancels.pop(request_id, None) is not None:
            call.close()
            raise Cancelled(f"request {request_id} was cancelled by its producer before its call started")
        task = asyncio.ensure_future(call)
        self._calls[request_id] = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            raise Cancelled(f"request {request_id} was cancelled by its producer while it ran") from None
        finally:
            self._calls.pop(request_id, None)

    async def _finish(
        self,
        run: Running,
        reply: bytes,
        group_pools: tuple[str, ...],
        settled: redelivery.Settlement | None = None,
    ) -> int:
        """Delivers the reply (if the producer is alive) or stores the retry or dead letter, and releases
        the lease, retrying Valkey briefly; a ``scripts.FINISH_*`` code, or FINISH_UNDELIVERED."""
        backoff: Backoff | None = None  # made on a first failure only: seeding its rng costs ~10 µs
        for attempt in range(FINISH_ATTEMPTS):
            try:
                return await self.queue.finish(
                    pool_id=run.pool_id,
                    producer_id=run.envelope.producer_id,
                    member=run.member,
                    reply=reply,
                    reply_ttl_s=self.settings.reply_ttl_s,
                    group_pools=group_pools,
                    token=run.token,
                    settlement=settled.kind if settled is not None else scripts.SETTLE_REPLY,
                    payload=settled.payload if settled is not None else b"",
                    due_at=settled.due_at if settled is not None else 0.0,
                    backend_id=run.backend_id,
                )
            except REDIS_ERRORS as exc:
                self.on_valkey_error(exc)
                if attempt == FINISH_ATTEMPTS - 1:
                    break
                backoff = backoff or Backoff(*self.settings.reconnect_backoff_s)
                await asyncio.sleep(backoff.next())
        return FINISH_UNDELIVERED

    def _record(
        self,
        run: Running,
        endpoint: str,
        completion: Completion | None,
        error: DispatchError | None,
        started: float,
        ended: float,
        code: int,
        summary: StreamSummary | None = None,
        settled: redelivery.Settlement | None = None,
    ) -> None:
        usage = completion.usage if completion is not None else None
        first_chunk_at = summary.first_chunk_at if summary is not None else None
        status, drop_reason = STATUS_OK if error is None else STATUS_ERROR, ""
        if code == scripts.FINISH_STALE:
            status, drop_reason = "dropped", DROP_STALE_ATTEMPT
        elif settled is not None and settled.kind == scripts.SETTLE_RETRY:
            status = redelivery.STATUS_RETRY
        elif settled is not None and settled.kind == scripts.SETTLE_REQUEUE:
            status, drop_reason = redelivery.STATUS_REQUEUED, "shutdown"
        elif code == scripts.FINISH_PRODUCER_GONE:
            drop_reason = DROP_REPLY_PRODUCER_GONE
        elif code == FINISH_UNDELIVERED:
            drop_reason = DROP_REPLY_UNDELIVERED
        shown = settled.error if settled is not None and settled.kind == scripts.SETTLE_DEAD else error
        outcome = Outcome(
            status,
            started,
            ended,
            backend_url=_shown_url(endpoint),
            error_type=shown.error_type if shown else "",
            error_message=str(shown) if shown else "",
            input_tokens=usage.input_tokens if usage else None,
            output_tokens=usage.output_tokens if usage else None,
            response_model=completion.model if completion else None,
            reply_delivered=code == scripts.FINISH_DELIVERED,
            cost=run.cost,
            drop_reason=drop_reason,
            time_to_first_token_s=first_chunk_at - started if first_chunk_at is not None else None,
            chunk_count=summary.chunks if summary is not None else None,
            attempt=run.envelope.attempt,
        )
        content: dict[str, Any] | None = None
        if self.store_content:
            content = content_attributes(run.envelope, completion.body if completion else None)
        record_span(self.tracer, run.envelope, self.identity, outcome, content=content)


def backend_answer(error: DispatchError) -> BackendAnswer | None:
    """What the backend answered, for the reply: its status, Retry-After and own message."""
    if not isinstance(error, BackendHTTPError):
        return None
    return BackendAnswer(error.status_code, error.backend_message, error.retry_after_s)
