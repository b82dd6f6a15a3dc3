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
#       backend lease zset, pool drain hash, then per other protected pool: its requests list, its
#       pool lease zset
# ARGV: expected sha1, mode ("launch" | "drop"), lease member, lease seconds, pool max, group limit,
#       lease record, this pool's protected slots, backend in-flight limit ('' = none: no backend
#       row), then per other protected pool: its protected slots
# Returns {code, in_flight_of_pool}; code is one of the CLAIM_* strings below.
# Protected slots as in the scheduler: outside its own protected slots a pool may take a group slot
# only if the slots still owed to the other backlogged protected pools stay free.
# The backend's limit (max_in_flight, or less while the load gate holds work) is checked against
# the backend's fleet-wide leases, across every group that uses it. A request that leaves the queue
# (launched or dropped) is counted in the pool's drain ring, which admission control reads.
CLAIM = (
    """
local head = redis.call('LINDEX', KEYS[1], 0)
if not head then return {'moved', 0} end
if redis.sha1hex(head) ~= ARGV[1] then return {'moved', 0} end
if ARGV[2] == 'drop' then
  redis.call('LPOP', KEYS[1])
"""
    + drain_lua("KEYS[7]")
    + """
  return {'dropped', 0}
end
local in_pool = redis.call('ZCARD', KEYS[3])
if redis.call('ZSCORE', KEYS[3], ARGV[3]) then
  redis.call('LPOP', KEYS[1])
  return {'duplicate', in_pool}
end
if redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('LPOP', KEYS[1])
  return {'producer_gone', 0}
end
if in_pool >= tonumber(ARGV[5]) then return {'pool_cap', in_pool} end
local in_group = redis.call('ZCARD', KEYS[2])
local limit = tonumber(ARGV[6])
if in_group >= limit then return {'group_cap', in_pool} end
if #KEYS > 7 and in_pool >= tonumber(ARGV[8]) then
  local reserved = 0
  for i = 8, #KEYS, 2 do
    if redis.call('LLEN', KEYS[i]) > 0 then
      local owed = tonumber(ARGV[10 + (i - 8) / 2]) - redis.call('ZCARD', KEYS[i + 1])
      if owed > 0 then reserved = reserved + owed end
    end
  end
  if in_group >= limit - reserved then return {'reserved', in_pool} end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local backend_limit = tonumber(ARGV[9])
if backend_limit then
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
  if redis.call('ZCARD', KEYS[6]) >= backend_limit then return {'backend_cap', in_pool} end
end
local expiry = now + tonumber(ARGV[4])
redis.call('ZADD', KEYS[2], expiry, ARGV[3])
redis.call('ZADD', KEYS[3], expiry, ARGV[3])
redis.call('HSET', KEYS[5], ARGV[3], ARGV[7])
if backend_limit then redis.call('ZADD', KEYS[6], expiry, ARGV[3]) end
redis.call('LPOP', KEYS[1])
"""
    + drain_lua("KEYS[7]")
    + """
return {'claimed', in_pool + 1}
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
#       pool wake list, backend lease zset, then the requests list of every pool of the group
# ARGV: reply bytes (empty: release only), reply list TTL ms, lease member, wake token cap, token TTL ms
# Returns 1 when the reply was delivered, 0 when the producer is gone (reply dropped).
# While the group has backlog, the freed slot wakes one idle dispatcher of the group (the one
# waiting longest), not necessarily the finisher, so the work spreads over the fleet.
FINISH = (
    """
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
redis.call('HDEL', KEYS[5], ARGV[3])
redis.call('ZREM', KEYS[7], ARGV[3])
for i = 8, #KEYS do
  if redis.call('LLEN', KEYS[i]) > 0 then
"""
    + wake_lua("KEYS[6]", "ARGV[4]", "ARGV[5]")
    + """
    break
  end
end
if ARGV[1] == '' then return 1 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"""
)

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

# KEYS: the group lease zset, the lease records hash, then every pool lease zset of the group and
#       the lease zsets of its backends
# Drops leases past their expiry (a killed dispatcher's), so observation counts only live ones, and
# returns the records of the group's expired leases: each is a call lost in flight.
REAP = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local lost = {}
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  local record = redis.call('HGET', KEYS[2], member)
  if record then
    lost[#lost + 1] = record
    redis.call('HDEL', KEYS[2], member)
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
for i = 3, #KEYS do redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now) end
return lost
"""
