"""How one producer puts a request on its pool's queue: the envelope encoded with its trace context,
the push (answered once persisted, for a durable group), the ingress key's lease held for the
request, and the durable pushes answered without their persistence counted for the dashboard.

A part of :class:`~runtime.producer.core.Producer`; the submit and the streamed call both use it.
"""

from __future__ import annotations

import time
from collections import Counter

import redis.asyncio as aioredis
from opentelemetry import trace

from runtime.config import ProducerSettings
from runtime.errors import QueueUnavailable
from runtime.policy.admission import KeyLimits
from runtime.producer.outcomes import ProducerStats
from runtime.producer.pools import PoolRegistry
from runtime.producer.tenancy import UNTAGGED_TAG, TenantTag, fair_push
from runtime.queue.admission import KeyLease, KeyLeases
from runtime.queue.keys import KeySpace
from runtime.queue.leases import lease_member
from runtime.queue.producing import Claimable, ProducerOps
from runtime.telemetry.tracing import span_carrier
from runtime.valkey.client import REDIS_ERRORS
from runtime.valkey.persisted import PERSISTED, PersistedPusher
from runtime.wire.contract import Call, Envelope, Metadata, StreamOptions

__all__ = ["Enqueuer"]


class Enqueuer:
    """The queue side of one producer (see the module doc)."""

    def __init__(
        self,
        client: aioredis.Redis,
        keys: KeySpace,
        *,
        producer_id: str,
        settings: ProducerSettings,
        pools: PoolRegistry,
        stats: ProducerStats,
    ) -> None:
        self.client = client
        self.keys = keys
        self.producer_id = producer_id
        self.settings = settings
        self.pools = pools
        self.stats = stats
        self.queue = ProducerOps(client, keys)
        self.key_leases = KeyLeases(client, keys, settings.alive_ttl_s)
        self.persistence = PersistedPusher(client, timeout_s=settings.persist_timeout_s)
        # (group, reason) of durable pushes answered without their persistence, not yet in Valkey.
        self.unpersisted: Counter[tuple[str, str]] = Counter()

    def __repr__(self) -> str:
        return f"<Enqueuer {self.producer_id} unpersisted={self.unpersisted.total()}>"

    def envelope(
        self,
        chat: Call,
        request_id: str,
        pool_id: str,
        metadata: Metadata,
        timeout_s: float,
        span: trace.Span,
        stream: StreamOptions | None = None,
        *,
        tenant: str | None = None,
    ) -> bytes:
        carrier = span_carrier(span)
        now = time.time()
        envelope = Envelope(
            request_id=request_id,
            producer_id=self.producer_id,
            pool_id=pool_id,
            call=chat,
            enqueued_at=now,
            deadline=now + timeout_s,
            trace=carrier,
            metadata=metadata,
            stream=stream,
            tenant=tenant,
        )
        return envelope.encode(max_bytes=self.settings.max_envelope_bytes)

    def lease(
        self, key: KeyLimits | None, pool_id: str, request_id: str, timeout_s: float
    ) -> KeyLease | None:
        if key is None or not key.bounded:
            return None
        return self.key_leases.lease(key, lease_member(pool_id, request_id), timeout_s)

    async def push(
        self,
        pool_id: str,
        request_id: str,
        raw: bytes,
        lease: KeyLease | None = None,
        timeout_s: float = 0.0,
        tag: TenantTag = UNTAGGED_TAG,
    ) -> None:
        """Queues the envelope; QueueFull (nothing queued) when the pool's admission limits, those of
        the ingress key holding ``lease``, or (in a fair pool) its tenant's cap refuse it."""
        limits = self.pools.limits(pool_id)
        group = self.pools.view.groups.get(self.pools.group_of(pool_id) or "")
        tenant = fair_push(group.pool(pool_id), tag) if group is not None else None
        try:
            if group is not None and group.durable:
                outcome = await self.queue.push_persisted(
                    self.persistence,
                    pool_id,
                    raw,
                    limits,
                    lease,
                    replicas=group.persist_replicas,
                    tenant=tenant,
                )
                if outcome != PERSISTED:
                    self.stats.unpersisted_pushes += 1
                    self.unpersisted[(group.group_id, outcome)] += 1
            else:
                claimable = (
                    Claimable(group.group_id, self.producer_id, lease_member(pool_id, request_id))
                    if group is not None and tenant is None
                    else None
                )
                await self.queue.push(pool_id, raw, limits, lease, tenant, claimable)
        except REDIS_ERRORS as exc:
            raise QueueUnavailable(f"could not enqueue request {request_id}: {exc}") from exc
        if lease is not None:
            self.key_leases.hold(lease, timeout_s)

    async def flush_unpersisted(self) -> None:
        """Adds the durable pushes answered without their persistence to their groups' counters
        (``unpersisted:<outcome>``, shown on the dashboard): with the liveness refresh, off the hot path."""
        pending, self.unpersisted = self.unpersisted, Counter()
        if not pending:
            return
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for (group_id, outcome), count in pending.items():
                    pipe.hincrby(self.keys.counters(group_id), f"unpersisted:{outcome}", count)
                await pipe.execute()
        except REDIS_ERRORS:
            self.unpersisted.update(pending)  # counted with the next refresh
            raise
