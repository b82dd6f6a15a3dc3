-- CLAIM's steps, shared with TENANT_CLAIM. KEYS and ARGV as CLAIM declares them up to `$last` (the
-- last key of the other protected pools: each names its list, or a fair pool's backlogged tenants, and
-- either exists only while the pool has backlog); `$drop` and `$launch` pop the head (a drop, a
-- launch), `$left` is the backlog after a launch.
local head = redis.call('LINDEX', KEYS[1], 0)
if not head then return {'moved', 0, 0} end
if redis.sha1hex(head) ~= ARGV[1] then return {'moved', 0, 0} end
if ARGV[2] == 'drop' then
  $drop
--! drain key=KEYS[10] count=1 time=redis.call('TIME')
  return {'dropped', 0, 0}
end
local in_pool = redis.call('ZCARD', KEYS[3])
if redis.call('ZSCORE', KEYS[3], ARGV[3]) then
  $drop
  return {'duplicate', in_pool, 0}
end
if redis.call('EXISTS', KEYS[4]) == 0 then
  $drop
  return {'producer_gone', 0, 0}
end
if in_pool >= tonumber(ARGV[5]) then return {'pool_cap', in_pool, 0} end
local in_group = redis.call('ZCARD', KEYS[2])
local limit = tonumber(ARGV[6])
if in_group >= limit then return {'group_cap', in_pool, 0} end
if $last > 11 and in_pool >= tonumber(ARGV[8]) then
  local reserved = 0
  for i = 12, $last, 2 do
    if redis.call('EXISTS', KEYS[i]) == 1 then
      local owed = tonumber(ARGV[11 + (i - 12) / 2]) - redis.call('ZCARD', KEYS[i + 1])
      if owed > 0 then reserved = reserved + owed end
    end
  end
  if in_group >= limit - reserved then return {'reserved', in_pool, 0} end
end
local t = redis.call('TIME')  -- the one TIME of a launch: its drain count reuses it
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local backend_limit = tonumber(ARGV[10])
if backend_limit then
  if redis.call('EXISTS', KEYS[11]) == 1 then return {'backend_held', in_pool, 0} end
  redis.call('ZREMRANGEBYSCORE', KEYS[9], '-inf', now)
  if redis.call('ZCARD', KEYS[9]) >= backend_limit then return {'backend_cap', in_pool, 0} end
end
local expiry = now + tonumber(ARGV[4])
redis.call('ZADD', KEYS[2], expiry, ARGV[3])
redis.call('ZADD', KEYS[3], expiry, ARGV[3])
redis.call('HSET', KEYS[5], ARGV[3], ARGV[7])
if backend_limit then redis.call('ZADD', KEYS[9], expiry, ARGV[3]) end
$launch
local token = 0
if ARGV[9] ~= '' then
  token = redis.call('INCR', KEYS[8])
  redis.call('HSET', KEYS[6], ARGV[3], token)
  redis.call('HSET', KEYS[7], ARGV[3], ARGV[9])
end
--! drain key=KEYS[10] count=1 time=t
return {'claimed', in_pool + 1, token, $left}
