-- TENANT_QUEUE: a fair pool's push past its admission checks, shared by TENANT_PUSH and
-- TENANT_PUSH_PLAIN: the envelope onto the tenant's list, the pool's queued count up, the tenant's
-- weight written; the tenant enters the backlogged set when its list was empty, and a dispatcher is
-- woken when the pool's was (its token the request). Defines `total`, the pool's queued count after
-- the push.
-- Params: list (the tenant's), envelope, count (the pool's queued count), weights (hash), tenant,
-- weight, zset (backlogged tenants), counters (hash), wake (key), cap and ttl (its token's), drain
-- (the pool's drain hash).
local n = redis.call('RPUSH', $list, $envelope)
local total = redis.call('INCR', $count)
redis.call('HSET', $weights, $tenant, $weight)
if n == 1 then
--! enter zset=$zset counters=$counters tenant=$tenant
end
if total == 1 then
  -- As the seed's push: only the pool's first queued request wakes a dispatcher (not every tenant's),
  -- with a token a lone dispatcher can claim it from: "<weight> <envelope>" (its launch's charge is
  -- divided by the weight; runtime.queue.tenant_dispatch.token_request).
  local wake_token = $weight .. ' ' .. $envelope
--! wake_head key=$wake cap=$cap ttl=$ttl head=wake_token
  local st = redis.call('TIME')
  redis.call('HSET', $drain, 'since', tonumber(st[1]) + tonumber(st[2]) / 1000000)
  redis.call('EXPIRE', $drain, $DRAIN_TTL_S)
end
