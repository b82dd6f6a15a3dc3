-- TENANT_CLAIM: CLAIM in a fair pool (tenant_fairness on): the head of one tenant's list, taken as CLAIM
-- takes it; every pop also lowers the pool's queued count, and the tenant leaves the backlogged set
-- when its list is now empty (its counter remembered as the last leaver's). A launch charges the
-- tenant's counter (and its score while backlogged) by the dispatcher's estimate / weight (0 for a
-- request charged at an earlier attempt); a drop charges nothing. What the call is served is counted
-- by its FINISH (lua/_tenant_correct.lua).
-- A wake token's request (its claim decided from the token, without a view of the tenants) launches
-- only while its tenant is the pool's pick, the backlogged tenant with the lowest counter (ties: the
-- lowest id, as the zset orders them); else it is `moved`, and the dispatcher reads the pool.
-- KEYS: CLAIM's (the first: the tenant's list), then the backlogged tenants zset, the counters hash,
--       the pool's queued count
-- ARGV: CLAIM's, then the tenant, the charge, '1' for a wake token's request (else '')
-- Returns as CLAIM; a launch's fourth element is the pool's queued count after it.
local zset, counters, count = KEYS[#KEYS - 2], KEYS[#KEYS - 1], KEYS[#KEYS]
local tenant, charge = ARGV[#ARGV - 2], ARGV[#ARGV - 1]
if ARGV[#ARGV] == '1' and ARGV[2] == 'launch' and redis.call('ZRANGE', zset, 0, 0)[1] ~= tenant then
  return {'moved', 0, 0}
end
local left = 0
local function popped(charged)
  redis.call('LPOP', KEYS[1])
  left = redis.call('DECR', count)
  local counter = nil
  charged = charged and tonumber(charge) ~= 0  -- a retry's or a requeued request's launch is free
  if charged then counter = redis.call('HINCRBYFLOAT', counters, tenant, charge) end
  if redis.call('LLEN', KEYS[1]) == 0 then
    -- LEAVE (lua/_leave.lua), with the counter the charge just gave
    if redis.call('ZREM', zset, tenant) == 1 then
      redis.call('HSET', counters, '*last', counter or redis.call('HGET', counters, tenant) or 0)
    end
  elseif charged then
    redis.call('ZADD', zset, 'XX', 'INCR', charge, tenant)
  end
end
--! claim last=#KEYS-3 drop=popped(false) launch=popped(true) left=math.max(0,left)
