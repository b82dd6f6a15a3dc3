"""Admission control in Valkey: the pool's limits checked and the request pushed in one script.

The rule is :func:`runtime.policy.admission.decide`; :data:`ADMIT_PUSH` applies it inside Valkey so
that the depth it reads is the depth it pushes onto: concurrent producers can never take a queue
past ``max_queued``. A refusal pushes nothing, counts ``{pool_id}:{reason}`` in the rejections hash
(:meth:`~runtime.wire.keys.KeySpace.rejections`) and answers with the depth and drain rate it saw;
:func:`admit_and_push` turns that into :class:`~runtime.errors.QueueFull` with the rule's details.

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

from typing import Any

from runtime.dispatch.wakeup import WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS, wake_lua
from runtime.errors import QueueFull
from runtime.policy.admission import DRAIN_WINDOW_S, AdmissionLimits, refusal
from runtime.wire.keys import KeySpace

__all__ = ["ADMIT_PUSH", "DRAIN_RING", "admission_args", "admit_and_push", "drain_lua", "queue_full"]

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


# KEYS: requests list, wake key, drain hash, rejections hash, [the backend's shared breaker state]
# ARGV: envelope, (wake args), max_queued or '', max_queue_wait_s or '', pool id, '1' when paused,
#       the breaker's open seconds
# Returns {1, new length} when pushed; {0, reason, depth, drain rate as text, seconds the backlog
# drained nothing as text} when refused.
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

# The push itself, as the producer's plain PUSH does it: RPUSH, and a wake token for one idle
# dispatcher when the request made the list non-empty (ARGV[2], ARGV[3]: token cap and TTL); then
# the backlog starts now (``since``).
_PUSH = (
    "local n = redis.call('RPUSH', KEYS[1], ARGV[1])\nif n == 1 then\n"
    + wake_lua("KEYS[2]", "ARGV[2]", "ARGV[3]")
    + _SINCE
    + "end\nreturn {1, n}\n"
)

ADMIT_PUSH = _ADMIT + _PUSH


def admission_args(
    keys: KeySpace, pool_id: str, raw: bytes, limits: AdmissionLimits
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of :data:`ADMIT_PUSH`."""
    script_keys = [
        keys.requests(pool_id),
        keys.wake_list(pool_id),
        keys.pool_drain(pool_id),
        keys.rejections(),
    ]
    if limits.breaker_backend_id:
        script_keys.append(keys.backend_breaker(limits.breaker_backend_id))
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
    return script_keys, args


def queue_full(pool_id: str, limits: AdmissionLimits, result: list[Any]) -> QueueFull:
    """The exception for a refusal the script answered with ``{0, reason, depth, rate, idle}``."""
    reason, rate_text, idle_text = (_text(result[i]) for i in (1, 3, 4))
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
    script: Any, keys: KeySpace, pool_id: str, raw: bytes, limits: AdmissionLimits
) -> int:
    """Pushes ``raw`` onto the pool's queue if its limits admit it; returns the new length.

    ``script`` is :data:`ADMIT_PUSH` registered on the caller's client (``client.register_script``:
    EVALSHA, loaded again after a Valkey restart). Raises :class:`QueueFull` (nothing queued) when
    refused; Valkey errors propagate.
    """
    script_keys, args = admission_args(keys, pool_id, raw, limits)
    result = await script(keys=script_keys, args=args)
    if int(result[0]) != 1:
        raise queue_full(pool_id, limits, result)
    return int(result[1])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
