-- Fragment (included as `--! tenant_view` once, at the top of a script): defines tenant_backlog() and
-- tenant_view(), a fair pool's reads as TENANT_OBSERVE and ROUND return them (issue 22).
-- tenant_backlog(zset, queued, seed, counters): the pool's queued count; self-healing first: untagged
-- work on the seed's list with `*` not backlogged (a pool switched on with work queued) enters `*`
-- and is counted.
-- tenant_view(zset, weights, seed, counters, prefix, depth, width, read): the W = width lowest
-- backlogged tenants {tenant, counter, weight, queued, heads} and the next one's {tenant, counter} as
-- the plan's horizon ({} when none), O(log n + W) whatever the number of tenants. Heads are read when
-- read is 1 (about depth in all, at least 2 per viewed tenant, at most depth), the lowest tenant's
-- first when it is 2 (for display), none when 0. A backlogged tenant whose list is empty leaves.
-- Counters and weights as text.
local function tenant_backlog(zset, queued, seed, counters)
  local waiting = redis.call('LLEN', seed)
  if waiting > 0 and not redis.call('ZSCORE', zset, '*') then
    redis.call('INCRBY', queued, waiting)
--! enter zset=zset counters=counters tenant='*'
  end
  return math.max(0, tonumber(redis.call('GET', queued)) or 0)
end

local function tenant_view(zset, weights, seed, counters, prefix, depth, width, read)
  local low = redis.call('ZRANGE', zset, 0, width, 'WITHSCORES')
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
    local list = tenant == '*' and seed or prefix .. tenant
    local heads, queued = {}, nil
    if read == 1 then
      heads = redis.call('LRANGE', list, 0, per - 1)
      if #heads < per then queued = #heads end  -- the whole list was read
    elseif read == 2 and #view == 0 then
      heads = redis.call('LRANGE', list, 0, 0)
    end
    queued = queued or redis.call('LLEN', list)
    if queued == 0 then
--! leave zset=zset counters=counters tenant=tenant
    else
      view[#view + 1] = {tenant, counter, '1', queued, heads}
      viewed[#viewed + 1] = tenant
    end
  end
  if #viewed > 0 then
    local found = redis.call('HMGET', weights, unpack(viewed))
    for j = 1, #view do view[j][3] = found[j] or '1' end
  end
  return view, horizon
end
