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
-- Without a lease, pool limits or a per-tenant cap the push is TENANT_PUSH_PLAIN (tenant_push_plain.lua).
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
--! tenant_queue list=KEYS[1] envelope=ARGV[1] count=KEYS[10] weights=KEYS[9] tenant=ARGV[14] weight=ARGV[15] zset=KEYS[7] counters=KEYS[8] wake=KEYS[2] cap=ARGV[2] ttl=ARGV[3] drain=KEYS[3]
if ARGV[17] == '1' then
  redis.call('ZADD', KEYS[6], now + tonumber(ARGV[12]), ARGV[11])
  redis.call('EXPIRE', KEYS[6], $KEY_SET_TTL_S)
end
return {1, total}
