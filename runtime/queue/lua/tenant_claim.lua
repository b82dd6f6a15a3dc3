-- TENANT_CLAIM: CLAIM in a fair pool (tenant_fairness on): the head of one tenant's list, taken as CLAIM
-- takes it; every pop also lowers the pool's queued count, and the tenant leaves the backlogged set
-- when its list is now empty (its counter remembered as the last leaver's). A launch charges the
-- tenant's counter (and its score while backlogged) by the dispatcher's estimate / weight; a drop
-- charges nothing.
-- KEYS: CLAIM's (the first: the tenant's list), then the backlogged tenants zset, the counters hash,
--       the pool's queued count, the served hash
-- ARGV: CLAIM's, then the tenant, the charge, the cost (the charge before the weight)
-- Returns as CLAIM; a launch's fourth element is the pool's queued count after it.
local zset, counters, count, served = KEYS[#KEYS - 3], KEYS[#KEYS - 2], KEYS[#KEYS - 1], KEYS[#KEYS]
local tenant, charge, cost = ARGV[#ARGV - 2], ARGV[#ARGV - 1], ARGV[#ARGV]
local function popped(charged)
  redis.call('LPOP', KEYS[1])
  redis.call('DECR', count)
  if charged then
    redis.call('HINCRBYFLOAT', counters, tenant, charge)
    redis.call('HINCRBYFLOAT', served, tenant, cost)
    if redis.call('ZSCORE', zset, tenant) then redis.call('ZINCRBY', zset, charge, tenant) end
  end
  if redis.call('LLEN', KEYS[1]) == 0 then
--! leave zset=zset counters=counters tenant=tenant
  end
end
--! claim last=#KEYS-4 drop=popped(false) launch=popped(true) left=math.max(0,tonumber(redis.call('GET',count))or(0))
