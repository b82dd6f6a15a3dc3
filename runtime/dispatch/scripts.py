"""The Lua scripts that make multi-command queue steps atomic (one round trip each).

OBSERVE reads one pool's backlog and lease count, and its head items only when the pool could launch
at all: a pool at its cap (or a group at its total) costs a few bytes per round however large its
queued envelopes are. Its first item is read for display only when the dispatcher asks (it has
none cached for the pool), so the oldest pending age stays visible at the cost of one read.

CLAIM takes exactly the request the dispatcher peeked: it compares the SHA-1 of the list head with
the peeked bytes, so a request taken by another dispatcher in between is never run under the wrong
cost. A launch refuses a second copy of a request that already holds a lease in the pool (caps count
running calls, and a copy would share the original's lease), checks the producer's liveness, the
hard caps and the protected slots of the group's other pools against the fleet-wide counts of that
instant, and records an in-flight lease with what it knows of the request in the same step; a drop
just removes the item.

Expired leases are reaped only by REAP, which hands back their records: a lease that expires
because its dispatcher died is a lost call, and it is counted, not silently forgotten.

In ``durable`` mode the claim also stores the envelope to requeue (its next attempt) and a fencing
token beside the lease: REAP puts an expired durable lease's request back at the head of its list
instead of losing it, and FINISH refuses a dispatcher whose token is no longer the lease's (its lease
expired and the request went back), so a stale dispatcher cannot reply, retry or dead-letter it.
"""

from __future__ import annotations

from runtime.dispatch.admission import drain_lua
from runtime.dispatch.wakeup import wake_lua

# KEYS: requests list, pool lease zset, group lease zset
# ARGV: depth, pool max, group limit, "1" to read the first item even when the pool cannot launch
# Returns {backlog, in_flight_of_pool, heads_read, heads}: heads_read is 1 when up to depth heads were
# read for launching, 2 when only the first was read (for display), 0 when none was.
OBSERVE = """
local backlog = redis.call('LLEN', KEYS[1])
local in_pool = redis.call('ZCARD', KEYS[2])
if backlog == 0 then return {0, in_pool, 0, {}} end
local depth = tonumber(ARGV[1])
if depth > 0 and in_pool < tonumber(ARGV[2]) and redis.call('ZCARD', KEYS[3]) < tonumber(ARGV[3]) then
  return {backlog, in_pool, 1, redis.call('LRANGE', KEYS[1], 0, depth - 1)}
end
if ARGV[4] == '1' then return {backlog, in_pool, 2, redis.call('LRANGE', KEYS[1], 0, 0)} end
return {backlog, in_pool, 0, {}}
"""

# KEYS: requests list, group lease zset, pool lease zset, producer alive key, lease records hash,
#       fencing tokens hash, durable envelopes hash, fencing counter, backend lease zset, pool drain
#       hash, then per other protected pool: its requests list, its pool lease zset
# ARGV: expected sha1, mode ("launch" | "drop"), lease member, lease seconds, pool max, group limit,
#       lease record, this pool's protected slots, the envelope to requeue if the lease expires ('' in
#       lists mode), backend in-flight limit ('' = none: no backend row), then per other protected
#       pool: its protected slots
# Returns {code, in_flight_of_pool, fencing token}; code is one of the CLAIM_* strings below; the token
# is 0 in lists mode. A launch returns a fourth element, the backlog left in the list right after its
# pop: a round that sees 0 there knows that a later push makes the list non-empty again (so its
# producer sends a wake token), and does not follow itself with a round that would find nothing.
# Protected slots as in the scheduler: outside its own protected slots a pool may take a group slot
# only if the slots still owed to the other backlogged protected pools stay free.
# The backend's limit (max_in_flight, or less while the load gate holds work) is checked against
# the backend's fleet-wide leases, across every group that uses it. A request that leaves the queue
# (launched or dropped) is counted in the pool's drain ring, which admission control reads.
CLAIM = (
    """
local head = redis.call('LINDEX', KEYS[1], 0)
if not head then return {'moved', 0, 0} end
if redis.sha1hex(head) ~= ARGV[1] then return {'moved', 0, 0} end
if ARGV[2] == 'drop' then
  redis.call('LPOP', KEYS[1])
"""
    + drain_lua("KEYS[10]")
    + """
  return {'dropped', 0, 0}
end
local in_pool = redis.call('ZCARD', KEYS[3])
if redis.call('ZSCORE', KEYS[3], ARGV[3]) then
  redis.call('LPOP', KEYS[1])
  return {'duplicate', in_pool, 0}
end
if redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('LPOP', KEYS[1])
  return {'producer_gone', 0, 0}
end
if in_pool >= tonumber(ARGV[5]) then return {'pool_cap', in_pool, 0} end
local in_group = redis.call('ZCARD', KEYS[2])
local limit = tonumber(ARGV[6])
if in_group >= limit then return {'group_cap', in_pool, 0} end
if #KEYS > 10 and in_pool >= tonumber(ARGV[8]) then
  local reserved = 0
  for i = 11, #KEYS, 2 do
    if redis.call('LLEN', KEYS[i]) > 0 then
      local owed = tonumber(ARGV[11 + (i - 11) / 2]) - redis.call('ZCARD', KEYS[i + 1])
      if owed > 0 then reserved = reserved + owed end
    end
  end
  if in_group >= limit - reserved then return {'reserved', in_pool, 0} end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local backend_limit = tonumber(ARGV[10])
if backend_limit then
  redis.call('ZREMRANGEBYSCORE', KEYS[9], '-inf', now)
  if redis.call('ZCARD', KEYS[9]) >= backend_limit then return {'backend_cap', in_pool, 0} end
end
local expiry = now + tonumber(ARGV[4])
redis.call('ZADD', KEYS[2], expiry, ARGV[3])
redis.call('ZADD', KEYS[3], expiry, ARGV[3])
redis.call('HSET', KEYS[5], ARGV[3], ARGV[7])
if backend_limit then redis.call('ZADD', KEYS[9], expiry, ARGV[3]) end
redis.call('LPOP', KEYS[1])
local token = 0
if ARGV[9] ~= '' then
  token = redis.call('INCR', KEYS[8])
  redis.call('HSET', KEYS[6], ARGV[3], token)
  redis.call('HSET', KEYS[7], ARGV[3], ARGV[9])
end
"""
    + drain_lua("KEYS[10]")
    + """
return {'claimed', in_pool + 1, token, redis.call('LLEN', KEYS[1])}
"""
)
CLAIMED = "claimed"
CLAIM_MOVED = "moved"
CLAIM_DROPPED = "dropped"
CLAIM_DUPLICATE = "duplicate"
CLAIM_PRODUCER_GONE = "producer_gone"
CLAIM_POOL_CAP = "pool_cap"
CLAIM_GROUP_CAP = "group_cap"
CLAIM_RESERVED = "reserved"
CLAIM_BACKEND_CAP = "backend_cap"  # the backend's in-flight limit; the dispatcher names the reason

# KEYS: producer alive key, replies list, group lease zset, pool lease zset, lease records hash,
#       pool wake list, fencing tokens hash, durable envelopes hash, delayed zset, dead-letter list,
#       backend lease zset, the pool's requests list, then the requests list of every pool of the group
# ARGV: reply bytes (empty: release only), reply list TTL ms, lease member, wake token cap, token TTL ms,
#       fencing token ('' unfenced: lists mode), settlement (SETTLE_*), the retry's next envelope or the
#       dead letter, the retry's due time
# Returns FINISH_DELIVERED, FINISH_PRODUCER_GONE, FINISH_STALE (the lease was taken away: nothing
# done, not even the backend's lease), FINISH_DELAYED (the retry waits in the delayed set) or
# FINISH_REQUEUED (a durable call its dispatcher could not finish before shutting down went back to
# the head of its pool's list, as an expired lease's would, without waiting for the lease to expire).
# While the group has backlog, the freed slot wakes one idle dispatcher of the group (the one
# waiting longest), not necessarily the finisher, so the work spreads over the fleet.
FINISH = (
    """
if ARGV[6] ~= '' and redis.call('HGET', KEYS[7], ARGV[3]) ~= ARGV[6] then return -1 end
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
redis.call('HDEL', KEYS[5], ARGV[3])
redis.call('HDEL', KEYS[7], ARGV[3])
redis.call('HDEL', KEYS[8], ARGV[3])
redis.call('ZREM', KEYS[11], ARGV[3])
if ARGV[7] == 'requeue' then redis.call('LPUSH', KEYS[12], ARGV[8]) end
for i = 12, #KEYS do
  if redis.call('LLEN', KEYS[i]) > 0 then
"""
    + wake_lua("KEYS[6]", "ARGV[4]", "ARGV[5]")
    + """
    break
  end
end
if ARGV[7] == 'retry' then
  redis.call('ZADD', KEYS[9], ARGV[9], ARGV[8])
  return 2
end
if ARGV[7] == 'requeue' then return 3 end
if ARGV[7] == 'dead' then redis.call('RPUSH', KEYS[10], ARGV[8]) end
if ARGV[1] == '' then return 1 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"""
)
FINISH_DELIVERED = 1
FINISH_PRODUCER_GONE = 0
FINISH_STALE = -1
FINISH_DELAYED = 2
FINISH_REQUEUED = 3

# KEYS: group lease zset, pool lease zset, backend lease zset; ARGV: new expiry offset seconds, member
# Extends a lease only if it still exists (XX), so a lease reaped after expiry is not revived.
RENEW = """
local t = redis.call('TIME')
local expiry = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[1])
redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[2])
redis.call('ZADD', KEYS[2], 'XX', expiry, ARGV[2])
redis.call('ZADD', KEYS[3], 'XX', expiry, ARGV[2])
return 1
"""

# KEYS: the group lease zset, the lease records hash, the durable envelopes hash, the fencing tokens
#       hash, then every pool lease zset of the group and the lease zsets of its backends
# ARGV: the requests-list key of a pool without its pool id (the key prefix up to it)
# Drops leases past their expiry (a killed or frozen dispatcher's), so observation counts only live
# ones. A durable lease's envelope goes back to the head of its pool's list (earliest claim first):
# a requeue. Any other expired lease with a record is a call lost in flight (a durable stream whose
# first chunk reached its producer gave its envelope up: its record says ``streamed``). Every expired
# lease loses its fencing token, so its dispatcher, if it still runs, can neither relay nor finish.
# Returns {records of the lost calls, requeued envelopes}.
REAP = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
local lost = {}
local requeued = {}
for i = #expired, 1, -1 do
  local member = expired[i]
  local envelope = redis.call('HGET', KEYS[3], member)
  if envelope then
    local pool = string.match(member, '^(.-)\\031')
    redis.call('LPUSH', ARGV[1] .. pool, envelope)
    redis.call('HDEL', KEYS[3], member)
    requeued[#requeued + 1] = envelope
  else
    local record = redis.call('HGET', KEYS[2], member)
    if record then lost[#lost + 1] = record end
  end
  redis.call('HDEL', KEYS[4], member)
  redis.call('HDEL', KEYS[2], member)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
for i = 5, #KEYS do redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now) end
return {lost, requeued}
"""


# How FINISH settles an attempt: reply to the producer, store its retry, or store its dead letter.
SETTLE_REPLY = "reply"
SETTLE_RETRY = "retry"
SETTLE_DEAD = "dead"
SETTLE_REQUEUE = "requeue"  # durable mode: back at the head of the pool's list (shutdown)

# Due retries moved per pool and promotion; the rest follow on the next one.
PROMOTE_BATCH = 256

# PROMOTE moves due retries from the pool's delayed set back to the head of its list (earliest due first)
# and wakes one dispatcher of the group.
# KEYS: delayed zset, requests list, wake list; ARGV: batch size, wake token cap, token TTL ms
# Returns how many due retries went back to the head of the list.
PROMOTE = (
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
if #due == 0 then return 0 end
for i = #due, 1, -1 do redis.call('LPUSH', KEYS[2], due[i]) end
redis.call('ZREM', KEYS[1], unpack(due))
"""
    + wake_lua("KEYS[3]", "ARGV[2]", "ARGV[3]")
    + """
return #due
"""
)

# KEYS: requests list, dead-letter list, producer alive key, replies list
# ARGV: expected sha1 of the head, dead letter bytes, reply bytes, reply list TTL ms
# Returns 1 when the head was dead-lettered, 0 when it had moved (someone else took it).
# BURY dead-letters a durable request found at its list's head after too many requeues, and tells its
# producer, in one step, taking the head exactly as the claim does (by its digest).
BURY = """
local head = redis.call('LINDEX', KEYS[1], 0)
if not head or redis.sha1hex(head) ~= ARGV[1] then return 0 end
redis.call('LPOP', KEYS[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('RPUSH', KEYS[4], ARGV[3])
  redis.call('PEXPIRE', KEYS[4], ARGV[4])
end
return 1
"""
