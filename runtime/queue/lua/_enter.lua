-- ENTER: a tenant whose list just became non-empty joins the fair pool's backlogged tenants at
-- max(its own counter, the floor); the floor is the lowest backlogged counter, else the last leaver's
-- (runtime.policy.tenants.TenantLedger.enter: a tenant without a counter starts at the floor).
-- Params: zset (backlogged tenants), counters (hash), tenant.
local low = redis.call('ZRANGE', $zset, 0, 0, 'WITHSCORES')
local floor = tonumber(low[2]) or tonumber(redis.call('HGET', $counters, '*last')) or 0
local own = tonumber(redis.call('HGET', $counters, $tenant))
local counter = math.max(own or floor, floor)
redis.call('ZADD', $zset, counter, $tenant)
if counter ~= own then redis.call('HSET', $counters, $tenant, counter) end  -- lifted, or new
