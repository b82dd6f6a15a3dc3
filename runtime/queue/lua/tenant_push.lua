-- TENANT_PUSH: a fair pool's push (tenant_fairness on): ADMIT_PUSH's checks against the pool's count
-- key, then the tenant's own cap, then the push onto the tenant's list; the tenant enters the
-- backlogged set when its list was empty, and a dispatcher is woken when the pool's was. Untagged
-- traffic is tenant '*' on the seed's list.
-- KEYS: the tenant's list, wake key, drain hash, rejections hash, breaker state, the key's open-requests
--       zset (a key never written without a lease), backlogged tenants zset, counters hash, weights
--       hash, the pool's queued count
-- ARGV: ADMIT_PUSH's 1-8, its key arguments 9-13 ('' without a lease), tenant, weight,
--       max_queued_per_tenant or '', '1' with a key lease
-- Returns as ADMIT_PUSH; a tenant at its cap is {0, 'max_queued_per_tenant', its queued, '0', '0'}.
local depth = tonumber(redis.call('GET', KEYS[10])) or 0
--! admit leased=ARGV[17]=='1'
local cap = tonumber(ARGV[16])
if cap then
  local mine = redis.call('LLEN', KEYS[1])
  if mine >= cap then
    redis.call('HINCRBY', KEYS[4], ARGV[6] .. ':max_queued_per_tenant', 1)
    return {0, 'max_queued_per_tenant', mine, '0', '0'}
  end
end
local n = redis.call('RPUSH', KEYS[1], ARGV[1])
local total = redis.call('INCR', KEYS[10])
redis.call('HSET', KEYS[9], ARGV[14], ARGV[15])
if n == 1 then
--! enter zset=KEYS[7] counters=KEYS[8] tenant=ARGV[14]
end
if total == 1 then
  -- As the seed's push: only the pool's first queued request wakes a dispatcher (not every tenant's).
--! wake key=KEYS[2] cap=ARGV[2] ttl=ARGV[3]
  local st = redis.call('TIME')
  redis.call('HSET', KEYS[3], 'since', tonumber(st[1]) + tonumber(st[2]) / 1000000)
  redis.call('EXPIRE', KEYS[3], $DRAIN_TTL_S)
end
if ARGV[17] == '1' then
  redis.call('ZADD', KEYS[6], now + tonumber(ARGV[12]), ARGV[11])
  redis.call('EXPIRE', KEYS[6], $KEY_SET_TTL_S)
end
return {1, total}
