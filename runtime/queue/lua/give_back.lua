-- GIVE_BACK: undoes a launch claim whose answer this dispatcher lost (its connection cut with the
-- claim pipeline sent but unanswered, as when a frozen Valkey is given up by the health check). The
-- claim's bytes may still have reached Valkey and run: the request then left its list as a lease of a
-- call that never started, which REAP would count lost in flight (lists mode) or requeue late
-- (durable). Only a lease whose record is still the one this claim wrote is undone, so a lease REAP
-- took already (and requeued, durable) is not queued twice; the request goes back to the head of its
-- list. What CLAIM wrote (lua/_claim.lua) is undone but the drain ring's count (a rate admission
-- reads) and the fencing counter (only ever rises).
-- KEYS: the list the claim took from (a fair pool: the tenant's), group lease zset, pool lease zset,
--       lease records hash, fencing tokens hash, durable envelopes hash, backend lease zset, then for
--       a fair pool: its backlogged tenants zset, counters hash, queued count
-- ARGV: lease member, the request as claimed, the claim's lease record, then for a fair pool: the
--       tenant, the charge the launch made
-- Returns 1 if the claim had run and is undone, else 0 (it never ran, or its lease is gone).
if redis.call('HGET', KEYS[4], ARGV[1]) ~= ARGV[3] then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[7], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
if #KEYS == 7 then
  redis.call('LPUSH', KEYS[1], ARGV[2])
  return 1
end
local zset, counters, count, tenant = KEYS[8], KEYS[9], KEYS[10], ARGV[4]
local charge = tonumber(ARGV[5])
if charge ~= 0 then  -- refunded: the request's next launch charges it again
  redis.call('HINCRBYFLOAT', counters, tenant, -charge)
  redis.call('ZADD', zset, 'XX', 'INCR', -charge, tenant)
end
redis.call('INCR', count)
if redis.call('LPUSH', KEYS[1], ARGV[2]) == 1 then
--! enter zset=zset counters=counters tenant=tenant
end
return 1
