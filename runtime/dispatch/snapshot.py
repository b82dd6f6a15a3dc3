"""The live snapshot of one dispatcher: runtime health, every pool's queue and caps, active requests.

Built from the dispatcher's in-memory state and its latest observation of Valkey (queue depth is the
real LLEN of every pool, not a sample). The dashboard merges the snapshots of all dispatchers of a
group; ``SNAPSHOT_SCHEMA`` changes when a field changes meaning.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypedDict

import orjson
import redis.asyncio as aioredis

from runtime.backends.redact import redact_url
from runtime.config import DispatcherSettings
from runtime.dispatch.peek import PeekedItem
from runtime.dispatch.running import RunningCalls
from runtime.dispatch.stats import DispatcherStats
from runtime.queue.dispatching import QueueView
from runtime.queue.keys import KeySpace
from runtime.telemetry.spans import Identity
from runtime.valkey.client import REDIS_ERRORS, valkey_server
from runtime.wire.groupconfig import GroupConfig

log = logging.getLogger(__name__)
SNAPSHOT_SCHEMA = 1
MAX_ACTIVE_LISTED = 50
HEARTBEAT_S = 2.0


class PoolSnapshot(TypedDict):
    """One pool as one dispatcher sees it: its configuration, queue, caps and what it dispatched."""

    pool_id: str
    display_name: str
    weight: int
    min_concurrent: int
    max_concurrent: int
    max_burst_per_visit: int
    enabled: bool
    paused: bool
    endpoint: str
    queue_depth: int
    in_flight: int
    in_flight_local: int
    oldest_pending_age_s: float | None
    head_cost: int | None
    deficit: int
    skips: dict[str, int]
    launched: int
    cost_dispatched: int
    lost_in_flight: int


class ActiveRequest(TypedDict):
    request_id: str
    pool_id: str
    producer_id: str
    model: str
    stage: str
    age_s: float
    queue_wait_s: float
    execution_s: float


class DispatcherSnapshot(TypedDict):
    """What one dispatcher publishes (Valkey key and live event); the dashboard merges a group's."""

    schema: int
    at: float
    group_id: str
    dispatcher_id: str
    gateway_id: str
    policy: str
    config_version: int
    total_concurrency: int
    concurrency: int
    up_since: float
    valkey_ok: bool
    valkey: str  # host:port of the Valkey it talks to now (after a failover, the new primary)
    valkey_reconnected_at: float | None  # when that connection was opened (epoch seconds)
    stopping: bool
    in_flight: int
    group_in_flight: int
    completed: int
    failed: dict[str, int]
    dropped: dict[str, int]
    internal_errors: int
    config_rejected: int
    claims_given_back: int  # claims run after their answers were lost, undone (runtime.queue.unanswered)
    ticket_claims: int  # calls a push claimed against this dispatcher's ticket (runtime.dispatch.tickets)
    tickets_given_back: int  # ... that it did not run, back at the head of their list
    breakers: dict[str, dict[str, object]]
    pools: list[PoolSnapshot]
    active: list[ActiveRequest]


SnapshotSink = Callable[[DispatcherSnapshot], Awaitable[None]]


class BreakerModes(Protocol):
    def modes(self) -> dict[str, dict[str, object]]: ...


class SnapshotSource(Protocol):
    """What the snapshot reads of a dispatcher: a small view, so this module needs no Dispatcher."""

    @property
    def config(self) -> GroupConfig | None: ...
    @property
    def settings(self) -> DispatcherSettings: ...
    @property
    def identity(self) -> Identity: ...
    @property
    def stats(self) -> DispatcherStats: ...
    @property
    def running(self) -> RunningCalls: ...
    @property
    def last_views(self) -> Mapping[str, QueueView]: ...
    @property
    def breakers(self) -> BreakerModes: ...
    @property
    def started_at(self) -> float: ...
    @property
    def valkey_ok(self) -> bool: ...
    @property
    def client(self) -> aioredis.Redis: ...
    @property
    def stopping(self) -> bool: ...
    @property
    def group_in_flight(self) -> int: ...
    def deficit(self, pool_id: str) -> int: ...
    def peeked_head(self, pool_id: str) -> PeekedItem | None: ...


def build_snapshot(dispatcher: SnapshotSource, *, now: float) -> DispatcherSnapshot:
    config = dispatcher.config
    assert config is not None
    stats = dispatcher.stats
    skips: dict[str, dict[str, int]] = {}
    for (pool_id, reason), count in stats.skips.items():
        skips.setdefault(pool_id, {})[reason] = count
    local_by_pool = dispatcher.running.by_pool()
    pools: list[PoolSnapshot] = []
    for pool in config.pools:
        view = dispatcher.last_views.get(pool.pool_id)
        head = dispatcher.peeked_head(pool.pool_id)
        pools.append(
            {
                "pool_id": pool.pool_id,
                "display_name": pool.display_name or pool.pool_id,
                "weight": pool.quantum,
                "min_concurrent": pool.min_concurrent,
                "max_concurrent": pool.max_concurrent,
                "max_burst_per_visit": pool.max_burst_per_visit,
                "enabled": pool.enabled,
                "paused": pool.paused,
                "endpoint": redact_url(config.endpoint_for(pool.pool_id)),
                "queue_depth": view.backlog if view else 0,
                "in_flight": view.in_flight if view else 0,
                "in_flight_local": local_by_pool.get(pool.pool_id, 0),
                "oldest_pending_age_s": round(max(0.0, now - head.envelope.enqueued_at), 3)
                if head and head.envelope
                else None,
                "head_cost": head.cost if head and head.envelope else None,
                "deficit": dispatcher.deficit(pool.pool_id),
                "skips": skips.get(pool.pool_id, {}),
                "launched": stats.launched_by_pool.get(pool.pool_id, 0),
                "cost_dispatched": stats.cost_by_pool.get(pool.pool_id, 0),
                "lost_in_flight": stats.lost_by_pool.get(pool.pool_id, 0),
            }
        )
    active = sorted(dispatcher.running.values(), key=lambda r: r.started_at)[:MAX_ACTIVE_LISTED]
    valkey, reconnected_at = valkey_server(dispatcher.client)
    return {
        "schema": SNAPSHOT_SCHEMA,
        "at": round(now, 3),
        "group_id": config.group_id,
        "dispatcher_id": dispatcher.identity.dispatcher_id,
        "gateway_id": dispatcher.identity.gateway_id,
        "policy": config.policy,
        "config_version": config.version,
        "total_concurrency": config.total_concurrency,
        "concurrency": dispatcher.settings.concurrency,
        "up_since": round(dispatcher.started_at, 3),
        "valkey_ok": dispatcher.valkey_ok,
        "valkey": valkey,
        "valkey_reconnected_at": round(reconnected_at, 3) if reconnected_at is not None else None,
        "stopping": dispatcher.stopping,
        "in_flight": len(dispatcher.running),
        "group_in_flight": dispatcher.group_in_flight,
        "completed": stats.completed,
        "failed": dict(stats.failed),
        "dropped": dict(stats.dropped),
        "internal_errors": stats.internal_errors,
        "config_rejected": stats.config_rejected,
        "claims_given_back": stats.claims_given_back,
        "ticket_claims": stats.ticket_claims,
        "tickets_given_back": stats.tickets_given_back,
        "breakers": dispatcher.breakers.modes(),
        "pools": pools,
        "active": [
            {
                "request_id": run.envelope.request_id,
                "pool_id": run.pool_id,
                "producer_id": run.envelope.producer_id,
                "model": run.envelope.call.model,
                "stage": run.stage,
                "age_s": round(max(0.0, now - run.envelope.enqueued_at), 3),
                # Apart, so a long queue wait is not read as a slow backend call.
                "queue_wait_s": round(max(0.0, run.started_at - run.envelope.enqueued_at), 3),
                "execution_s": round(max(0.0, now - run.started_at), 3),
            }
            for run in active
        ],
    }


class SnapshotStore:
    """Keeps a dispatcher's latest snapshot in Valkey (with a TTL, so a dead dispatcher disappears),
    flushes its counters into the group's hash, and sends live events when something changed."""

    def __init__(
        self,
        client: aioredis.Redis,
        keys: KeySpace,
        *,
        group_id: str,
        dispatcher_id: str,
        ttl_s: float,
        sink: SnapshotSink | None,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self.client = client
        self.key = keys.snapshot(group_id, dispatcher_id)
        self.counters_key = keys.counters(group_id)
        self.ttl_ms = int(ttl_s * 1000)
        self.sink = sink
        self.on_error = on_error
        self._last_sent: dict[str, Any] = {}
        self._last_sent_at = 0.0

    def __repr__(self) -> str:
        return f"<SnapshotStore {self.key} sink={'yes' if self.sink else 'no'}>"

    async def publish(self, snap: DispatcherSnapshot, stats: DispatcherStats) -> None:
        deltas = stats.unflushed()
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.set(self.key, orjson.dumps(snap), px=self.ttl_ms)
                for name, delta in deltas.items():
                    pipe.hincrby(self.counters_key, name, delta)
                await pipe.execute()
        except REDIS_ERRORS as exc:
            stats.restore(deltas)
            self.on_error(exc)
        if self.sink is not None and self._changed(snap):
            try:
                await self.sink(snap)
            except Exception as exc:  # the live feed must never stop dispatch
                log.warning("snapshot sink failed: %s", exc)

    async def withdraw(self, stats: DispatcherStats) -> None:
        """On a clean stop: the snapshot goes at once, the last counters are flushed."""
        with contextlib.suppress(*REDIS_ERRORS):
            await self.client.delete(self.key)
            deltas = stats.unflushed()
            if deltas:
                async with self.client.pipeline(transaction=False) as pipe:
                    for name, delta in deltas.items():
                        pipe.hincrby(self.counters_key, name, delta)
                    await pipe.execute()

    def _changed(self, snap: DispatcherSnapshot) -> bool:
        """Live events on change, and at least every few seconds as a heartbeat."""
        significant: dict[str, Any] = {k: v for k, v in snap.items() if k not in ("at", "active")}
        significant["active"] = [(a["request_id"], a["stage"]) for a in snap["active"]]
        now = time.monotonic()
        if significant == self._last_sent and now - self._last_sent_at < HEARTBEAT_S:
            return False
        self._last_sent, self._last_sent_at = significant, now
        return True
