-- TENANT_WITHDRAW: WITHDRAW in a fair pool: the request leaves its tenant's list (the pool's queued
-- count goes down with it, and the tenant leaves the backlogged set when its list is now empty,
-- remembered as the last leaver), or its retry leaves the delayed set; then it is counted.
-- KEYS: the tenant's list, the pool's delayed set, backlogged tenants zset, counters hash, the pool's
--       queued count and, when its group is known, the group's counters
-- ARGV: the envelope, the counter's field, the start of the request's envelopes, the tenant
-- Returns how many were removed.
local removed = redis.call('LREM', KEYS[1], 1, ARGV[1])
if removed > 0 then
  redis.call('DECR', KEYS[5])
  if redis.call('LLEN', KEYS[1]) == 0 then
--! leave zset=KEYS[3] counters=KEYS[4] tenant=ARGV[4]
  end
else
--! delayed_take
end
if removed > 0 and KEYS[6] then redis.call('HINCRBY', KEYS[6], ARGV[2], 1) end
return removed
