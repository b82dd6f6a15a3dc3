-- TENANT_BURY: BURY in a fair pool: dead-letters a durable request found at its tenant's list's head
-- after too many requeues and tells its producer, taking the head as TENANT_CLAIM's drop does (by its
-- digest; the pool's queued count goes down, and the tenant leaves when its list is now empty).
-- KEYS: BURY's (the first: the tenant's list), then the backlogged tenants zset, the counters hash,
--       the pool's queued count
-- ARGV: BURY's, then the tenant
-- Returns 1 when the head was dead-lettered, 0 when it had moved (someone else took it).
local zset, counters, tenant = KEYS[5], KEYS[6], ARGV[5]
local head = redis.call('LINDEX', KEYS[1], 0)
if not head or redis.sha1hex(head) ~= ARGV[1] then return 0 end
redis.call('LPOP', KEYS[1])
redis.call('DECR', KEYS[7])
if redis.call('LLEN', KEYS[1]) == 0 then
--! leave zset=zset counters=counters tenant=tenant
end
--! bury_letter
return 1
