-- TENANT_OBSERVE: OBSERVE for a fair pool: its queued count, its leases, and a view of its W lowest
-- backlogged tenants (counter, weight, queued, first heads), plus the next one's (counter, tenant) as
-- the plan's horizon (lua/_tenant_view.lua, which ROUND shares). O(log n + W) whatever the number of
-- tenants. Heads are read as OBSERVE reads them when the pool could launch, else the lowest tenant's
-- first for display when asked. Self-healing as tenant_backlog() and tenant_view() say.
-- KEYS: backlogged tenants zset, weights hash, queued count, pool lease zset, group lease zset, the
--       seed's list, counters hash
-- ARGV: depth, pool max, group limit, "1" to read the first item even when the pool cannot launch, W,
--       the tenant lists' key prefix (the key of tenant '' of the pool)
-- Returns {backlog, in_flight_of_pool, heads_read, {tenant, counter, weight, queued, heads}..., horizon}
-- with heads_read as OBSERVE's and the horizon {tenant, counter} or {}; counters and weights as text.
--! tenant_view
local backlog = tenant_backlog(KEYS[1], KEYS[3], KEYS[6], KEYS[7])
local in_pool = redis.call('ZCARD', KEYS[4])
if redis.call('EXISTS', KEYS[1]) == 0 then return {backlog, in_pool, 0, {}, {}} end
local depth, width = tonumber(ARGV[1]), tonumber(ARGV[5])
local launchable = depth > 0 and in_pool < tonumber(ARGV[2]) and redis.call('ZCARD', KEYS[5]) < tonumber(ARGV[3])
local read = launchable and 1 or (ARGV[4] == '1' and 2 or 0)
local view, horizon = tenant_view(KEYS[1], KEYS[2], KEYS[6], KEYS[7], ARGV[6], depth, width, read)
return {backlog, in_pool, read, view, horizon}
