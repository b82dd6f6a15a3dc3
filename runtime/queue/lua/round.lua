-- ROUND: the group's observation for the next decision, and the scheduling turn that decision needs.
-- Sent after the claims of the decision before it, in the same pipeline: one round trip per decision.
-- KEYS: turn key, again key, fleet zset, group lease zset, a wake list (for another dispatcher), then
--       per pool: its requests list, its pool lease zset; for a fair pool (tenant fairness on, issue
--       22) instead: its backlogged tenants zset, weights hash, queued count, pool lease zset, the
--       seed's list, counters hash
-- ARGV: holder id, turn lease ms, fleet membership seconds, fleet member ("<holder id> <local slots>"),
--       local free slots once the claims before this script succeed, group limit, "1" when the round
--       left work for other dispatchers' slots, wake token cap, token TTL ms, then per pool: "f" for a
--       fair pool else "p", depth, pool max, "1" to read the first item even when the pool cannot
--       launch, and for a fair pool W and the tenant lists' key prefix (as TENANT_OBSERVE's)
-- Returns {turn, fleet members, group in flight, {backlog, in_flight_of_pool, heads_read, heads}...}
-- with heads_read as OBSERVE's; a fair pool's entry is TENANT_OBSERVE's answer {backlog, in_flight,
-- heads_read, view, horizon} (lua/_tenant_view.lua; no view when nothing is read, the lowest tenant
-- alone when only its first item is read for display). turn is 1 when the observation lets this
-- dispatcher launch something (some pool's heads were read for launching; a fair pool's only when
-- its view holds a tenant): the turn is its own until its next ROUND, so nobody else decides
-- meanwhile. 0 when it allows nothing: the turn is given back, a note left meanwhile
-- becomes a wake token, and so does work left for others' slots. -1 when another dispatcher holds the
-- turn: nothing is read, and the note left here makes the holder's release wake one of us.
--! tenant_view
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local fleet = redis.call('ZRANGE', KEYS[3], 0, -1)
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
  return {-1, fleet, 0}
end
local free = tonumber(ARGV[5])
local limit = tonumber(ARGV[6])
local in_group = redis.call('ZCARD', KEYS[4])
local launchable, wanted = false, false
local out = {0, fleet, in_group}
local k, a = 6, 10
while k <= #KEYS do
  local depth, pool_max = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  if ARGV[a] == 'f' then
    local zset, seed, counters = KEYS[k], KEYS[k + 4], KEYS[k + 5]
    local backlog = tenant_backlog(zset, KEYS[k + 2], seed, counters)
    local in_pool = redis.call('ZCARD', KEYS[k + 3])
    if redis.call('EXISTS', zset) == 0 then
      out[#out + 1] = {backlog, in_pool, 0, {}, {}}
    else
      local open = in_pool < pool_max and in_group < limit
      local read = (open and free > 0 and depth > 0) and 1 or (ARGV[a + 3] == '1' and 2 or 0)
      if read == 0 then
        -- Nothing to launch or show (no free slot after the claims, mostly): no view, as a plain
        -- pool's heads are not read then.
        wanted = wanted or (open and backlog > 0)
        out[#out + 1] = {backlog, in_pool, 0, {}, {}}
      else
        -- For display only the lowest tenant's first head is read.
        local width = read == 1 and tonumber(ARGV[a + 4]) or 1
        local view, horizon = tenant_view(zset, KEYS[k + 1], seed, counters, ARGV[a + 5], depth, width, read)
        if read == 1 and #view > 0 then
          launchable = true
        else
          wanted = wanted or (open and #view > 0)
        end
        out[#out + 1] = {backlog, in_pool, read, view, horizon}
      end
    end
    k, a = k + 6, a + 6
  else
    local backlog = redis.call('LLEN', KEYS[k])
    local in_pool = redis.call('ZCARD', KEYS[k + 1])
    local open = backlog > 0 and in_pool < pool_max and in_group < limit
    if backlog == 0 then
      out[#out + 1] = {0, in_pool, 0, {}}
    elseif open and free > 0 and depth > 0 then
      launchable = true
      out[#out + 1] = {backlog, in_pool, 1, redis.call('LRANGE', KEYS[k], 0, depth - 1)}
    else
      wanted = wanted or open
      if ARGV[a + 3] == '1' then
        out[#out + 1] = {backlog, in_pool, 2, redis.call('LRANGE', KEYS[k], 0, 0)}
      else
        out[#out + 1] = {backlog, in_pool, 0, {}}
      end
    end
    k, a = k + 2, a + 4
  end
end
if launchable then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  out[1] = 1
  return out
end
if holder then redis.call('DEL', KEYS[1]) end
local again = redis.call('GETDEL', KEYS[2])
if again or (wanted and (free == 0 or ARGV[7] == '1')) then
--! wake key=KEYS[5] cap=ARGV[8] ttl=ARGV[9]
end
return out
