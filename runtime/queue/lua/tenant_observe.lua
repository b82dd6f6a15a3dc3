-- TENANT_OBSERVE: OBSERVE for a fair pool: its queued count, its leases, and a view of its W lowest
-- backlogged tenants (counter, weight, queued, first heads), plus the next one's (counter, tenant) as
-- the plan's horizon. O(log n + W) whatever the number of tenants. Heads are read as OBSERVE reads
-- them when the pool could launch (about depth in all, at least 2 per viewed tenant, at most depth),
-- else the lowest tenant's first for display when asked. Self-healing: untagged work on the seed's
-- list with `*` not backlogged (a pool switched on with work queued) enters `*` and is counted; a
-- backlogged tenant whose list is empty leaves.
-- KEYS: backlogged tenants zset, weights hash, queued count, pool lease zset, group lease zset, the
--       seed's list, counters hash
-- ARGV: depth, pool max, group limit, "1" to read the first item even when the pool cannot launch, W,
--       the tenant lists' key prefix (the key of tenant '' of the pool)
-- Returns {backlog, in_flight_of_pool, heads_read, {tenant, counter, weight, queued, heads}..., horizon}
-- with heads_read as OBSERVE's and the horizon {tenant, counter} or {}; counters and weights as text.
local seed = redis.call('LLEN', KEYS[6])
if seed > 0 and not redis.call('ZSCORE', KEYS[1], '*') then
  redis.call('INCRBY', KEYS[3], seed)
--! enter zset=KEYS[1] counters=KEYS[7] tenant='*'
end
local in_pool = redis.call('ZCARD', KEYS[4])
local backlog = math.max(0, tonumber(redis.call('GET', KEYS[3])) or 0)
if redis.call('EXISTS', KEYS[1]) == 0 then return {backlog, in_pool, 0, {}, {}} end
local depth, width = tonumber(ARGV[1]), tonumber(ARGV[5])
local launchable = depth > 0 and in_pool < tonumber(ARGV[2]) and redis.call('ZCARD', KEYS[5]) < tonumber(ARGV[3])
local read = launchable and 1 or (ARGV[4] == '1' and 2 or 0)
local low = redis.call('ZRANGE', KEYS[1], 0, width, 'WITHSCORES')
-- A round launches at most depth, shared by the viewed tenants: each needs about its share of heads
-- (twice it, for uneven counters). A plan that runs out of a tenant's heads stops early, never guesses.
local per = math.min(depth, math.max(2, math.ceil(2 * depth / math.max(1, math.min(width, #low / 2)))))
local view, horizon, viewed = {}, {}, {}
for i = 1, #low, 2 do
  local tenant, counter = low[i], low[i + 1]
  if (i + 1) / 2 > width then
    horizon = {tenant, counter}
    break
  end
  local list = tenant == '*' and KEYS[6] or ARGV[6] .. tenant
  local heads, queued = {}, nil
  if read == 1 then
    heads = redis.call('LRANGE', list, 0, per - 1)
    if #heads < per then queued = #heads end  -- the whole list was read
  elseif read == 2 and #view == 0 then
    heads = redis.call('LRANGE', list, 0, 0)
  end
  queued = queued or redis.call('LLEN', list)
  if queued == 0 then
--! leave zset=KEYS[1] counters=KEYS[7] tenant=tenant
  else
    view[#view + 1] = {tenant, counter, '1', queued, heads}
    viewed[#viewed + 1] = tenant
  end
end
if #viewed > 0 then
  local weights = redis.call('HMGET', KEYS[2], unpack(viewed))
  for j = 1, #view do view[j][3] = weights[j] or '1' end
end
return {backlog, in_pool, read, view, horizon}
