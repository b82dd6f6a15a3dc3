-- OBSERVE: one pool's backlog and lease count, and its head items only when the pool could launch.
-- KEYS: requests list, pool lease zset, group lease zset
-- ARGV: depth, pool max, group limit, "1" to read the first item even when the pool cannot launch
-- Returns {backlog, in_flight_of_pool, heads_read, heads}: heads_read is 1 when up to depth heads were
-- read for launching, 2 when only the first was read (for display), 0 when none was.
local backlog = redis.call('LLEN', KEYS[1])
local in_pool = redis.call('ZCARD', KEYS[2])
if backlog == 0 then return {0, in_pool, 0, {}} end
local depth = tonumber(ARGV[1])
if depth > 0 and in_pool < tonumber(ARGV[2]) and redis.call('ZCARD', KEYS[3]) < tonumber(ARGV[3]) then
  return {backlog, in_pool, 1, redis.call('LRANGE', KEYS[1], 0, depth - 1)}
end
if ARGV[4] == '1' then return {backlog, in_pool, 2, redis.call('LRANGE', KEYS[1], 0, 0)} end
return {backlog, in_pool, 0, {}}
