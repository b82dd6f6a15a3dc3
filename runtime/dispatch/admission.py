"""Admission control in Valkey: the pool's limits checked and the request pushed in one script.

The rule is :func:`runtime.policy.admission.decide`; :data:`ADMIT_PUSH` applies it inside Valkey so
that the depth it reads is the depth it pushes onto: concurrent producers can never take a queue
past ``max_queued``. A refusal pushes nothing, counts ``{pool_id}:{reason}`` in the rejections hash
(:meth:`~runtime.wire.keys.KeySpace.rejections`) and answers with the depth and drain rate it saw;
:func:`admit_and_push` turns that into :class:`~runtime.errors.QueueFull` with the rule's details.

An ingress key's own limits (:class:`~runtime.policy.admission.KeyLimits`) are checked first in the
same script, over the whole fleet: the key's open requests are lease members in its sorted set
(:meth:`~runtime.wire.keys.KeySpace.key_open`), added with the push and scored by a lease expiry. Open
ones count against ``max_in_flight``; those without a dispatcher's lease in their pool (not started)
against ``max_queued``. The producer removes its member when the request ends (answered, withdrawn,
timed out) and renews its leases with its liveness: a web process that dies leaks nothing for longer
than one liveness TTL, and a request never holds its key past its own deadline.

The drain rate is what left the queue per second over the last
:data:`~runtime.policy.admission.DRAIN_WINDOW_S` whole seconds. Dispatchers count each claim in a
small ring of per-second buckets (:func:`drain_lua`, run inside their claim), so the hash stays at
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
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from runtime.dispatch.wakeup import WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS, wake_lua
from runtime.errors import QueueFull
from runtime.policy.admission import (
    DRAIN_WINDOW_S,
    KEY_RETRY_AFTER_S,
    REASON_KEY_IN_FLIGHT,
    REASON_KEY_QUEUED,
    AdmissionLimits,
    KeyLimits,
    refusal,
)
from runtime.valkey.client import REDIS_ERRORS
from runtime.valkey.lua import LuaScript
from runtime.wire.keys import KeySpace

__all__ = [
    "ADMIT_PUSH",
    "DRAIN_RING",
    "KEY_LEASE_RENEW",
    "KeyLease",
    "KeyLeases",
    "admission_args",
    "admit_and_push",
    "drain_lua",
    "queue_full",
]

DRAIN_RING = DRAIN_WINDOW_S + 2  # buckets: the window, the current second, one being reused
# The hash outlives the ring's window by far: a stalled pool's last drain must still be known.
DRAIN_TTL_S = 3600

# Count ``count`` requests that left the queue now in the ring of KEYS[key] (a Lua expression).
_DRAIN_LUA = """
do
  local dsec = tonumber(redis.call('TIME')[1])
  local slot = dsec % {ring}
  if redis.call('HGET', {key}, 's' .. slot) ~= tostring(dsec) then
    redis.call('HSET', {key}, 's' .. slot, dsec, 'c' .. slot, 0)
  end
  redis.call('HINCRBY', {key}, 'c' .. slot, {count})
  local dt = redis.call('TIME')
  redis.call('HSET', {key}, 'last', tonumber(dt[1]) + tonumber(dt[2]) / 1000000)
  redis.call('EXPIRE', {key}, {ttl})
end
"""


def drain_lua(key: str, count: str = "1") -> str:
    """The drain count as a Lua fragment, for the script that takes requests off the queue."""
    return _DRAIN_LUA.format(key=key, count=count, ring=DRAIN_RING, ttl=DRAIN_TTL_S)


# KEYS: requests list, wake key, drain hash, rejections hash, the backend's shared breaker state
#       (a key never written when the pool has no breaker), [the key's open-requests zset]
# ARGV: envelope, (wake args), max_queued or '', max_queue_wait_s or '', pool id, '1' when paused,
#       the breaker's open seconds,
#       [key max_in_flight or '', key max_queued or '', lease member, lease seconds, pool-lease key prefix]
# Returns {1, new length} when pushed; {0, reason, depth (or the key's count), drain rate as text,
# seconds the backlog drained nothing as text} when refused.
_KEY_ADMIT = """
local now = 0
if KEYS[6] then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
  local open = redis.call('ZRANGE', KEYS[6], 0, -1)
  local reason, count = nil, #open
  local most_open, most_queued = tonumber(ARGV[9]), tonumber(ARGV[10])
  if most_open and #open >= most_open then reason = 'IN_FLIGHT' end
  if not reason and most_queued and #open >= most_queued then
    -- Not started: no dispatcher's lease in its pool (the member is the lease's, pool id first).
    count = 0
    for _, member in ipairs(open) do
      local cut = string.find(member, string.char(31), 1, true)
      local leased = cut and redis.call('ZSCORE', ARGV[13] .. string.sub(member, 1, cut - 1), member)
      if not leased then count = count + 1 end
    end
    if count >= most_queued then reason = 'QUEUED' end
  end
  if reason then
    redis.call('HINCRBY', KEYS[4], ARGV[6] .. ':' .. reason, 1)
    return {0, reason, count, '0', '0'}
  end
end
""".replace("IN_FLIGHT", REASON_KEY_IN_FLIGHT).replace("QUEUED", REASON_KEY_QUEUED)

_ADMIT = """
local depth = redis.call('LLEN', KEYS[1])
local function drain_rate()
  local now = tonumber(redis.call('TIME')[1])
  local fields = {}
  for i = 0, RING - 1 do
    fields[#fields + 1] = 's' .. i
    fields[#fields + 1] = 'c' .. i
  end
  local v = redis.call('HMGET', KEYS[3], unpack(fields))
  local total = 0
  for i = 0, RING - 1 do
    local s = tonumber(v[2 * i + 1])
    if s and s >= now - WINDOW and s <= now - 1 then total = total + (tonumber(v[2 * i + 2]) or 0) end
  end
  return total / WINDOW
end
local reason, rate = nil, nil
local max_queued = tonumber(ARGV[4])
if max_queued and depth >= max_queued then
  reason = 'max_queued'
end
local max_wait = tonumber(ARGV[5])
local idle = 0
if not reason and max_wait then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  local raw = KEYS[5] and redis.call('GET', KEYS[5])
  local ok, breaker = pcall(cjson.decode, raw or '')
  if ARGV[7] == '1' then
    reason = 'paused'
  elseif ok and type(breaker) == 'table' and breaker.mode == 'open'
      and now < (tonumber(breaker.since) or 0) + tonumber(ARGV[8]) then
    reason = 'breaker_open'
  elseif depth > 0 then
    local v = redis.call('HMGET', KEYS[3], 'last', 'since')
    local since = tonumber(v[2])
    if not since then
      since = now
      redis.call('HSET', KEYS[3], 'since', now)
    end
    idle = now - math.max(since, tonumber(v[1]) or 0)
    if idle > max_wait then reason = 'not_draining' end
  end
end
if not reason and max_wait and depth > 0 then
  rate = drain_rate()
  if rate > 0 and depth / rate > max_wait then reason = 'max_queue_wait' end
end
if reason then
  redis.call('HINCRBY', KEYS[4], ARGV[6] .. ':' .. reason, 1)
  return {0, reason, depth, tostring(rate or drain_rate()), tostring(idle)}
end
""".replace("RING", str(DRAIN_RING)).replace("WINDOW", str(DRAIN_WINDOW_S))

_SINCE = f"""
local st = redis.call('TIME')
redis.call('HSET', KEYS[3], 'since', tonumber(st[1]) + tonumber(st[2]) / 1000000)
redis.call('EXPIRE', KEYS[3], {DRAIN_TTL_S})
"""

# The set of a key nobody uses any more goes away after this (its members expire far sooner).
KEY_SET_TTL_S = 3600
_KEY_LEASE = f"""
if KEYS[6] then
  redis.call('ZADD', KEYS[6], now + tonumber(ARGV[12]), ARGV[11])
  redis.call('EXPIRE', KEYS[6], {KEY_SET_TTL_S})
end
"""

# The push itself, as the producer's plain PUSH does it: RPUSH, and a wake token for one idle
# dispatcher when the request made the list non-empty (ARGV[2], ARGV[3]: token cap and TTL); then
# the backlog starts now (``since``). The key's lease is taken with the push: no request of the key
# is queued uncounted.
_PUSH = (
    "local n = redis.call('RPUSH', KEYS[1], ARGV[1])\nif n == 1 then\n"
    + wake_lua("KEYS[2]", "ARGV[2]", "ARGV[3]")
    + _SINCE
    + "end\n"
    + _KEY_LEASE
    + "return {1, n}\n"
)

ADMIT_PUSH = _KEY_ADMIT + _ADMIT + _PUSH

# KEYS: a key's open-requests zset; ARGV: pairs of lease member, seconds from now. Renews the leases
# still held (ZADD XX: one released meanwhile is not brought back).
KEY_LEASE_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local renewed = 0
for i = 1, #ARGV, 2 do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[i + 1]), ARGV[i])
end
redis.call('EXPIRE', KEYS[1], KEY_SET_TTL)
return renewed
""".replace("KEY_SET_TTL", str(KEY_SET_TTL_S))


@dataclass(frozen=True, slots=True)
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
        self._renew = LuaScript(KEY_LEASE_RENEW).bind(client)
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
    keys: KeySpace, pool_id: str, raw: bytes, limits: AdmissionLimits, lease: KeyLease | None = None
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of :data:`ADMIT_PUSH`."""
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
) -> int:
    """Pushes ``raw`` onto the pool's queue if its limits (and its key's, with ``lease``) admit it;
    returns the new length.

    ``script`` is :data:`ADMIT_PUSH` registered on the caller's client (``client.register_script``:
    EVALSHA, loaded again after a Valkey restart). Raises :class:`QueueFull` (nothing queued) when
    refused; Valkey errors propagate.
    """
    script_keys, args = admission_args(keys, pool_id, raw, limits, lease)
    result = await script(keys=script_keys, args=args)
    if int(result[0]) != 1:
        raise queue_full(pool_id, limits, result, lease.limits if lease is not None else None)
    return int(result[1])
