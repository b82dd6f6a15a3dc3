-- CLAIM: takes exactly the request the dispatcher peeked (by the SHA-1 of the list head).
-- KEYS: requests list, group lease zset, pool lease zset, producer alive key, lease records hash,
--       fencing tokens hash, durable envelopes hash, fencing counter, backend lease zset, pool drain
--       hash, then per other protected pool: its requests list, its pool lease zset
-- ARGV: expected sha1, mode ("launch" | "drop"), lease member, lease seconds, pool max, group limit,
--       lease record, this pool's protected slots, the envelope to requeue if the lease expires ('' in
--       lists mode), backend in-flight limit ('' = none: no backend row), then per other protected
--       pool: its protected slots
-- Returns {code, in_flight_of_pool, fencing token}; code is one of the CLAIM_* strings of
-- runtime.queue.scripts; the token is 0 in lists mode. A launch returns a fourth element, the backlog
-- left in the list right after its pop: a round that sees 0 there knows that a later push makes the
-- list non-empty again (so its producer sends a wake token), and does not follow itself with a round
-- that would find nothing.
-- Protected slots as in the scheduler: outside its own protected slots a pool may take a group slot
-- only if the slots still owed to the other backlogged protected pools stay free.
-- The backend's limit (max_in_flight, or less while the load gate holds work) is checked against
-- the backend's fleet-wide leases, across every group that uses it. A request that leaves the queue
-- (launched or dropped) is counted in the pool's drain ring, which admission control reads.
local head = redis.call('LINDEX', KEYS[1], 0)
if not head then return {'moved', 0, 0} end
if redis.sha1hex(head) ~= ARGV[1] then return {'moved', 0, 0} end
if ARGV[2] == 'drop' then
  redis.call('LPOP', KEYS[1])
--! drain key=KEYS[10] count=1
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
--! drain key=KEYS[10] count=1
return {'claimed', in_pool + 1, token, redis.call('LLEN', KEYS[1])}
