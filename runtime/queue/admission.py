"""Admission control in Valkey: the pool's limits checked and the request pushed in one script.

The rule is :func:`runtime.policy.admission.decide`; ``lua/admit_push.lua`` applies it inside Valkey so
that the depth it reads is the depth it pushes onto: concurrent producers can never take a queue
past ``max_queued``. A refusal pushes nothing, counts ``{pool_id}:{reason}`` in the rejections hash
(:meth:`~runtime.queue.keys.KeySpace.rejections`) and answers with the depth and drain rate it saw;
:func:`admit_and_push` turns that into :class:`~runtime.errors.QueueFull` with the rule's details.

An ingress key's own limits (:class:`~runtime.policy.admission.KeyLimits`) are checked first in the
same script, over the whole fleet: the key's open requests are lease members in its sorted set
(:meth:`~runtime.queue.keys.KeySpace.key_open`), added with the push and scored by a lease expiry. Open
ones count against ``max_in_flight``; those without a dispatcher's lease in their pool (not started)
against ``max_queued``. The producer removes its member when the request ends (answered, withdrawn,
timed out) and renews its leases with its liveness: a web process that dies leaks nothing for longer
than one liveness TTL, and a request never holds its key past its own deadline.

The drain rate is what left the queue per second over the last
:data:`~runtime.policy.admission.DRAIN_WINDOW_S` whole seconds. Dispatchers count each claim in a
small ring of per-second buckets (``lua/_drain.lua``, run inside their claim), so the hash stays at
``2 * (window + 2)`` fields whatever the traffic, plus ``last`` (when a request last left) and
``since`` (when the list last became non-empty through admission).

With ``max_queue_wait_s`` a pool that drains nothing has an unbounded wait and is refused (the pure
rule's :class:`~runtime.policy.admission.Stall`): paused, its backend's shared breaker open (the
state :mod:`runtime.backends.shared_breaker` keeps), or backlog with nothing leaving for longer than
``max_queue_wait_s`` (measured from the later of ``since`` and ``last``).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import redis.asyncio as aioredis

from runtime.errors import QueueFull
from runtime.immutable import immutable
from runtime.policy.admission import (
    KEY_RETRY_AFTER_S,
    REASON_KEY_IN_FLIGHT,
    REASON_KEY_QUEUED,
    AdmissionLimits,
    KeyLimits,
    refusal,
)
from runtime.queue import registry
from runtime.queue.claimable import Claimable, claim_keys
from runtime.queue.keys import DRAIN_TTL_S, KEY_SET_TTL_S, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS, KeySpace
from runtime.queue.registry import DRAIN_RING
from runtime.queue.scripts import ADMIT_PUSH, KEY_LEASE_RENEW
from runtime.valkey.client import REDIS_ERRORS

__all__ = [
    "ADMIT_PUSH",
    "DRAIN_RING",
    "DRAIN_TTL_S",
    "KEY_LEASE_RENEW",
    "KEY_SET_TTL_S",
    "KeyLease",
    "KeyLeases",
    "admission_args",
    "admit_and_push",
    "queue_full",
]


@immutable
class KeyLease:
    """One request's place among its key's open requests: the key's limits, the set and the member."""

    limits: KeyLimits
    zset: str
    member: str
    seconds: float  # the first lease: the request's time, at most one liveness TTL


class KeyLeases:
    """The key leases one producer holds: renewed with its liveness, released when their request ends.

    A lease never outlives its request's deadline nor, unrenewed, one liveness TTL: a producer that
    dies or loses Valkey cannot lock its keys out for longer.
    """

    def __init__(self, client: aioredis.Redis, keys: KeySpace, ttl_s: float) -> None:
        self.client = client
        self.keys = keys
        self.ttl_s = ttl_s
        self._renew = registry.script("key_lease_renew").bind(client)
        self._held: dict[str, dict[str, float]] = {}  # zset -> member -> deadline (time.monotonic)

    def __repr__(self) -> str:
        return f"<KeyLeases keys={len(self._held)} held={sum(len(m) for m in self._held.values())}>"

    def lease(self, limits: KeyLimits, member: str, timeout_s: float) -> KeyLease:
        return KeyLease(limits, self.keys.key_open(limits.key_id), member, min(timeout_s, self.ttl_s))

    def hold(self, lease: KeyLease, timeout_s: float) -> None:
        """Records a lease the push took, to renew it until :meth:`release`."""
        self._held.setdefault(lease.zset, {})[lease.member] = time.monotonic() + timeout_s

    async def release(self, lease: KeyLease) -> None:
        members = self._held.get(lease.zset)
        if members is None or members.pop(lease.member, None) is None:
            return
        if not members:
            del self._held[lease.zset]
        # A release that fails leaves the lease to expire on its own, within one TTL.
        with contextlib.suppress(*REDIS_ERRORS):
            await self.client.zrem(lease.zset, lease.member)

    async def renew(self) -> None:
        now = time.monotonic()
        for zset, members in list(self._held.items()):
            args: list[Any] = []
            for member, deadline in members.items():
                args += [member, repr(max(0.0, min(deadline - now, self.ttl_s)))]
            if args:
                await self._renew(keys=[zset], args=args)


def admission_args(
    keys: KeySpace,
    pool_id: str,
    raw: bytes,
    limits: AdmissionLimits,
    lease: KeyLease | None = None,
    *,
    filled: bool = False,
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of :data:`ADMIT_PUSH` (``lua/admit_push.lua`` declares them). ``filled``: the
    key's place is filled without a ``lease`` too (by a key nobody writes), so that what follows it
    keeps its place."""
    script_keys = [
        keys.requests(pool_id),
        keys.wake_list(pool_id),
        keys.pool_drain(pool_id),
        keys.rejections(),
        # Always in place, so that the key's zset has a fixed position: a pool without a breaker
        # names a key nobody writes.
        keys.backend_breaker(limits.breaker_backend_id or ""),
    ]
    args: list[Any] = [
        raw,
        WAKE_TOKEN_CAP,
        WAKE_TOKEN_TTL_MS,
        "" if limits.max_queued is None else limits.max_queued,
        "" if limits.max_queue_wait_s is None else repr(limits.max_queue_wait_s),
        pool_id,
        "1" if limits.paused else "",
        repr(limits.breaker_open_s),
    ]
    if lease is not None:
        script_keys.append(lease.zset)
        key = lease.limits
        args += [
            "" if key.max_in_flight is None else key.max_in_flight,
            "" if key.max_queued is None else key.max_queued,
            lease.member,
            repr(lease.seconds),
            keys.pool_inflight(""),
        ]
    elif filled:
        script_keys.append(keys.key_open(""))
        args += ["", "", "", "0", keys.pool_inflight("")]
    return script_keys, args


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def queue_full(
    pool_id: str, limits: AdmissionLimits, result: list[Any], key: KeyLimits | None = None
) -> QueueFull:
    """The exception for a refusal the script answered with ``{0, reason, depth, rate, idle}``."""
    reason = _text(result[1])
    if key is not None and reason in (REASON_KEY_IN_FLIGHT, REASON_KEY_QUEUED):
        count = int(result[2])
        return QueueFull(
            key.describe(reason, count),
            pool_id=pool_id,
            reason=reason,
            depth=count,
            limit=float(key.limit(reason)),
            retry_after_s=KEY_RETRY_AFTER_S,
        )
    rate_text, idle_text = _text(result[3]), _text(result[4])
    details = refusal(reason, int(result[2]), limits, float(rate_text), idle_s=float(idle_text))
    return QueueFull(
        details.describe(pool_id),
        pool_id=pool_id,
        reason=details.reason,
        depth=details.depth,
        limit=details.limit,
        retry_after_s=details.retry_after_s,
    )


async def admit_and_push(
    script: Any,
    keys: KeySpace,
    pool_id: str,
    raw: bytes,
    limits: AdmissionLimits,
    lease: KeyLease | None = None,
    claimable: Claimable | None = None,
) -> int:
    """Pushes ``raw`` onto the pool's queue if its limits (and its key's, with ``lease``) admit it;
    returns the new length (0: claimed at once against a dispatcher's standing ticket, possible only
    with ``claimable``, as :meth:`~runtime.queue.producing.ProducerOps.push`).

    ``script`` is :data:`ADMIT_PUSH` registered on the caller's client (``client.register_script``:
    EVALSHA, loaded again after a Valkey restart). Raises :class:`QueueFull` (nothing queued) when
    refused; Valkey errors propagate.
    """
    script_keys, args = admission_args(keys, pool_id, raw, limits, lease, filled=claimable is not None)
    if claimable is not None:
        script_keys += claim_keys(keys, pool_id, claimable)
        args += ["1" if lease is not None else "", claimable.lease_member]
    result = await script(keys=script_keys, args=args)
    if int(result[0]) != 1:
        raise queue_full(pool_id, limits, result, lease.limits if lease is not None else None)
    return int(result[1])
