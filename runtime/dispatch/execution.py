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
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from opentelemetry import trace

from runtime.backends.adapter import BackendPool, Completion, OpenAIBackend
from runtime.backends.fleet import BackendFleet
from runtime.backends.redact import redact_url
from runtime.backoff import Backoff
from runtime.config import DispatcherSettings
from runtime.dispatch import redelivery, tenant_round
from runtime.dispatch.results import (
    FINISH_UNDELIVERED,
    count_finish,
    cut_by_shutdown,
    cut_stream_reply,
    reply_bytes,
    span_outcome,
)
from runtime.dispatch.running import Running
from runtime.dispatch.stats import DispatcherStats
from runtime.dispatch.streaming import (
    Fence,
    ProducerGoneMidStream,
    StreamRelay,
    StreamSummary,
    stream_timeout,
)
from runtime.errors import (
    BackendTimeout,
    Cancelled,
    DeadlineExceeded,
    DispatchError,
    Rejected,
    RequestExpired,
)
from runtime.queue import scripts
from runtime.queue.dispatching import QueueOps
from runtime.queue.leases import LeaseRecord
from runtime.telemetry.spans import Identity, content_attributes, record_span
from runtime.valkey.client import REDIS_ERRORS, failing_over
from runtime.wire.contract import Envelope, Timing
from runtime.wire.groupconfig import GroupConfig

log = logging.getLogger(__name__)
# A FINISH Valkey refused is retried this often at most: a call waits little past the new primary.
FINISH_BACKOFF_MAX_S = 1.0
# A failure this close to the request's deadline was cut short by it: never retried.
DEADLINE_SLACK_S = 0.05
# A cancel can beat its call (claimed, call not started yet): such ids are kept this long, this many.
EARLY_CANCEL_S = 30.0
EARLY_CANCELS_MAX = 1024
# A call whose FINISH gave up is remembered this long, this many: its lease is reaped later, uncounted.
UNDELIVERED_KEPT_S = 600.0
UNDELIVERED_MAX = 1024
_T = TypeVar("_T")


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
        on_finish_retrying: Callable[[Running], None] = lambda run: None,
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
        self.on_finish_retrying = on_finish_retrying
        # The task of each call in progress (its own execute task: no second task per call), and the
        # ids of those its producer withdrew, so that cancel is told apart from shutdown.
        self._calls: dict[str, asyncio.Task[Any]] = {}
        self._withdrawn: set[str] = set()
        self._early_cancels: dict[str, float] = {}
        # (pool, request id) of calls this executor counts the end of: running, or undelivered (until).
        self._settling: dict[tuple[str, str], float] = {}
        self._group_pools_of: tuple[GroupConfig | None, tuple[str, ...]] = (None, ())
        self.relay = StreamRelay(
            queue.client, queue.keys, reply_ttl_s=settings.reply_ttl_s, group_id=queue.group_id
        )

    def cancel(self, request_id: str) -> bool:
        """Cuts off the backend call of a request whose producer withdrew it; False if none runs here."""
        call = self._calls.get(request_id)
        if call is not None:
            self._withdrawn.add(request_id)
            return call.cancel()
        # Every dispatcher of the group hears every cancel, so most of these ids never run here.
        now = time.monotonic()
        if len(self._early_cancels) >= EARLY_CANCELS_MAX:
            self._early_cancels = {r: t for r, t in self._early_cancels.items() if now - t < EARLY_CANCEL_S}
        if len(self._early_cancels) < EARLY_CANCELS_MAX:
            self._early_cancels[request_id] = now
        return False

    def settles(self, record: LeaseRecord) -> bool:
        """Whether the call of an expired lease is this executor's to count: still running or finishing
        (a lease can expire while Valkey fails over), or its reply was already counted undelivered."""
        until = self._settling.get((record.pool_id, record.request_id))
        return until is not None and (until == 0.0 or until > time.monotonic())

    def _settled(self, run: Running, code: int) -> None:
        key = (run.pool_id, run.envelope.request_id)
        if code != FINISH_UNDELIVERED or run.token:  # a durable lease is requeued, never counted lost
            self._settling.pop(key, None)
            return
        now = time.monotonic()
        if len(self._settling) >= UNDELIVERED_MAX:
            self._settling = {k: t for k, t in self._settling.items() if t == 0.0 or t > now}
        if len(self._settling) < UNDELIVERED_MAX:
            self._settling[key] = now + UNDELIVERED_KEPT_S

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
        summary = StreamSummary(endpoint=envelope.call.endpoint) if envelope.stream is not None else None
        shutdown: redelivery.Settlement | None = None
        self._settling[(run.pool_id, envelope.request_id)] = 0.0
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
            error, shutdown = cut_by_shutdown(run.envelope, run.token, summary)
        except Exception as exc:  # a bug must still answer the producer and free the slot
            log.exception("unexpected error executing request %s", envelope.request_id)
            error = DispatchError(f"internal dispatcher error: {exc}")
        ended = time.time()
        run.stage = "replying"
        timing = Timing(
            max(0.0, started - envelope.enqueued_at), ended - started, max(0.0, ended - envelope.enqueued_at)
        )
        settled = shutdown or (self._settle(run, config, error, ended, timing) if refused is None else None)
        reply = settled.reply if settled is not None else reply_bytes(envelope, completion, error, timing)
        if self.queue.charges:  # a fair pool's call: its FINISH corrects its tenant's charge (issue 22)
            tenant_round.correct(self.queue, run.member, completion, config.pool(run.pool_id))
        code = await self._finish(run, reply, self._group_pools(config), settled)
        if code == scripts.FINISH_PRODUCER_GONE and isinstance(error, ProducerGoneMidStream):
            await self._tell_cut(run, summary, timing)
        self._settled(run, code)
        count_finish(self.stats, code, error, settled)
        outcome = span_outcome(
            envelope, run.cost, endpoint, completion, error, started, ended, code, summary, settled
        )
        content = (
            content_attributes(envelope, completion.body if completion else None)
            if self.store_content
            else None
        )
        record_span(self.tracer, envelope, self.identity, outcome, content=content)

    async def _tell_cut(self, run: Running, summary: StreamSummary | None, timing: Timing) -> None:
        """A stream cut off because its producer's marker lapsed: FINISH, which checks the marker, did
        not deliver its end, so the producer, if alive after all (the marker lapsed for a moment), is
        told at once, not at its caller's timeout. Lost if Valkey fails now: the caller then times out."""
        reply = cut_stream_reply(run.envelope, summary, timing)
        try:
            await self.queue.answer_gone([(run.envelope.producer_id, reply)], self.settings.reply_ttl_s)
        except REDIS_ERRORS as exc:
            log.warning("could not tell the producer of request %s its stream was cut: %s",
                        run.envelope.request_id, exc)  # fmt: skip

    def _fence(self, run: Running) -> Fence:
        """What a streamed attempt relays under; in durable mode, the lease record its first chunk stores."""
        if not run.token:
            return Fence(run.member)
        record = LeaseRecord.of(
            run.envelope, pool_id=run.pool_id, claimed_at=run.started_at,
            dispatcher_id=self.identity.dispatcher_id, cost=run.cost,
        )  # fmt: skip
        return Fence(run.member, run.token, dataclasses.replace(record, streamed=True).encode())

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
                    else backend.complete(
                        envelope.call.to_openai(), timeout_s=timeout, endpoint=envelope.call.endpoint
                    )
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
        """Runs the backend call so that :meth:`cancel` can cut it off, telling that apart from shutdown.

        The call runs in the execute task itself (a task of its own per call cost ~3.5 µs): cancel
        marks the request withdrawn and cancels this task, which is inside ``await call`` whenever it
        is registered here. A withdrawal alone (one cancel request) becomes :class:`Cancelled`; a
        shutdown's cancel on top of it propagates.
        """
        if self._early_cancels.pop(request_id, None) is not None:
            call.close()
            raise Cancelled(f"request {request_id} was cancelled by its producer before its call started")
        task = asyncio.current_task()
        assert task is not None
        self._calls[request_id] = task
        try:
            return await call
        except asyncio.CancelledError:
            if request_id not in self._withdrawn or task.cancelling() > 1:
                raise
            self._withdrawn.discard(request_id)
            task.uncancel()
            raise Cancelled(f"request {request_id} was cancelled by its producer while it ran") from None
        finally:
            self._calls.pop(request_id, None)
            if request_id in self._withdrawn:  # the call absorbed the cancel: it no longer stands
                self._withdrawn.discard(request_id)
                task.uncancel()

    async def _finish(
        self,
        run: Running,
        reply: bytes,
        group_pools: tuple[str, ...],
        settled: redelivery.Settlement | None = None,
    ) -> int:
        """Delivers the reply (if the producer is alive) or stores the retry or dead letter, and releases
        the lease; a ``scripts.FINISH_*`` code, or FINISH_UNDELIVERED.

        The call is done, so a Valkey error is retried for ``settings.finish_retry_s``: long enough to
        outlast a Sentinel failover (a few seconds), after which the reply is lost and counted. The
        dispatcher frees the call's slot at the first failure (``on_finish_retrying``) and goes on
        renewing its lease; in durable mode the fencing token still refuses a FINISH whose lease was
        reaped meanwhile (``FINISH_STALE``), so a requeued copy's reply is the only one.
        """
        backoff: Backoff | None = None  # made on a first failure only: seeding its rng costs ~10 µs
        give_up_at = 0.0
        while True:
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
                if backoff is None:
                    initial = self.settings.reconnect_backoff_s[0]
                    backoff = Backoff(initial, max(initial, FINISH_BACKOFF_MAX_S))
                    give_up_at = time.monotonic() + self.settings.finish_retry_s
                    self.on_finish_retrying(run)
                pause = backoff.next(failing_over=failing_over(exc))
                if time.monotonic() + pause > give_up_at:
                    return FINISH_UNDELIVERED
                await asyncio.sleep(pause)
