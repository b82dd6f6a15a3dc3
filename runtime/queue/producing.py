"""Producer side of the queue: a request pushed (admitted first when limits apply) or withdrawn.

Both are one script each (``lua/push.lua`` or ``lua/admit_push.lua``, ``lua/withdraw.lua``); Valkey
errors propagate for the caller to translate into its own error tree.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from runtime.errors import Cancelled
from runtime.policy.admission import AdmissionLimits
from runtime.queue import registry
from runtime.queue.admission import KeyLease, admission_args, admit_and_push, queue_full
from runtime.queue.claimable import Claimable, claim_keys
from runtime.queue.keys import WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS, KeySpace
from runtime.queue.tenants import (
    TenantPush,
    plain_push,
    tenant_push_args,
    tenant_push_plain_args,
    tenant_queue_full,
)
from runtime.valkey.persisted import PersistedPusher
from runtime.wire.contract import envelope_prefix

__all__ = ["Claimable", "ProducerOps"]


class ProducerOps:
    """The queue operations of one producer's client."""

    def __init__(self, client: aioredis.Redis, keys: KeySpace) -> None:
        self.client = client
        self.keys = keys
        # Run by SHA over the client's pipelined connection (a direct-mode producer may have no Valkey
        # client at all: nothing is sent until a push).
        self._push = registry.script("push").bind(client)
        self._admit = registry.script("admit_push").bind(client)
        self._withdraw = registry.script("withdraw").bind(client)
        self._tenant_push = registry.script("tenant_push").bind(client)
        self._tenant_push_plain = registry.script("tenant_push_plain").bind(client)
        self._tenant_withdraw = registry.script("tenant_withdraw").bind(client)

    def __repr__(self) -> str:
        return f"<ProducerOps prefix={self.keys.prefix!r}>"

    async def push(
        self,
        pool_id: str,
        raw: bytes,
        limits: AdmissionLimits,
        lease: KeyLease | None = None,
        tenant: TenantPush | None = None,
        claimable: Claimable | None = None,
    ) -> int:
        """Queues the envelope; returns the list's new length (a fair pool's: its queued count; 0: claimed
        at once against a dispatcher's standing ticket, possible only with ``claimable``: a plain pool's
        request in lists mode). Raises
        QueueFull (nothing queued) when the pool's limits, or those of the ingress key holding ``lease``,
        or ``tenant``'s cap in a fair pool (``tenant`` given only for one), refuse it."""
        if tenant is not None:
            if plain_push(limits, tenant, lease):  # nothing to check: the fair pool's plain push
                script_keys, args = tenant_push_plain_args(self.keys, pool_id, raw, tenant)
                return int((await self._tenant_push_plain(keys=script_keys, args=args))[1])
            script_keys, args = tenant_push_args(self.keys, pool_id, raw, limits, tenant, lease)
            result = await self._tenant_push(keys=script_keys, args=args)
            if int(result[0]) != 1:
                raise tenant_queue_full(pool_id, limits, result, tenant, lease)
            return int(result[1])
        if limits.bounded or lease is not None:
            # The limits are checked and the request pushed (and counted against its key) in one
            # script: racing producers never take the queue past max_queued, nor a key past its own.
            return await admit_and_push(self._admit, self.keys, pool_id, raw, limits, lease, claimable)
        # One script: the push, and, only when the list was empty, the claim against a standing ticket
        # or else a wake-up token (wake one, not all).
        script_keys = [self.keys.requests(pool_id), self.keys.wake_list(pool_id)]
        push_args: list[bytes | str | int] = [raw, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS]
        if claimable is not None:
            script_keys += [*claim_keys(self.keys, pool_id, claimable), self.keys.pool_drain(pool_id)]
            push_args.append(claimable.lease_member)
        return int(await self._push(keys=script_keys, args=push_args))

    async def push_persisted(
        self,
        persistence: PersistedPusher,
        pool_id: str,
        raw: bytes,
        limits: AdmissionLimits,
        lease: KeyLease | None = None,
        *,
        replicas: int = 0,
        tenant: TenantPush | None = None,
    ) -> str:
        """A durable group's push, answered once Valkey has it persisted (``WAITAOF``, and ``WAIT`` for
        ``replicas``: :mod:`runtime.valkey.persisted`); returns the outcome. Raises QueueFull as
        :meth:`push` does."""
        admitted = limits.bounded or lease is not None or tenant is not None
        if tenant is not None and plain_push(limits, tenant, lease):
            script = registry.script("tenant_push_plain")
            script_keys, args = tenant_push_plain_args(self.keys, pool_id, raw, tenant)
        elif tenant is not None:
            script = registry.script("tenant_push")
            script_keys, args = tenant_push_args(self.keys, pool_id, raw, limits, tenant, lease)
        elif admitted:
            script = registry.script("admit_push")
            script_keys, args = admission_args(self.keys, pool_id, raw, limits, lease)
        else:
            script = registry.script("push")
            script_keys = [self.keys.requests(pool_id), self.keys.wake_list(pool_id)]
            args = [raw, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS]
        result, outcome = await persistence.push(script, script_keys, args, replicas=replicas)
        if tenant is not None and int(result[0]) != 1:
            raise tenant_queue_full(pool_id, limits, result, tenant, lease)
        if admitted and int(result[0]) != 1:
            raise queue_full(pool_id, limits, result, lease.limits if lease is not None else None)
        return outcome

    async def withdraw(
        self,
        pool_id: str,
        request_id: str,
        producer_id: str,
        raw: bytes,
        group_id: str | None,
        tenant: str | None = None,
    ) -> bool:
        """Takes a queued request back out of its list, or its retry out of the pool's delayed set
        (counted ``dropped:cancelled`` in its group); one a dispatcher already claimed is cancelled
        through the group's cancel channel. True when it was still queued."""
        # Taken out and counted in one script: nobody sees the queue without it and the count not yet.
        counters = [self.keys.counters(group_id)] if group_id else []
        args = [raw, f"dropped:{Cancelled.error_type}", envelope_prefix(request_id, producer_id)]
        if tenant is not None:  # a fair pool's request: on its tenant's list ('*': the seed's)
            removed = await self._tenant_withdraw(
                keys=[
                    self.keys.tenant_requests(pool_id, tenant), self.keys.delayed(pool_id),
                    self.keys.tenants(pool_id), self.keys.tenant_counters(pool_id),
                    self.keys.pool_queued(pool_id), *counters,
                ],
                args=[*args, tenant],
            )  # fmt: skip
        else:
            removed = await self._withdraw(
                keys=[self.keys.requests(pool_id), self.keys.delayed(pool_id), *counters], args=args
            )
        if group_id and not removed:
            await self.client.publish(self.keys.cancel_channel(group_id), request_id.encode())
        return bool(removed)
