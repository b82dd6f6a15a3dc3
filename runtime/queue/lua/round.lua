-- ROUND: the group's observation for the next decision, and the scheduling turn that decision needs.
-- Sent after the claims of the decision before it, in the same pipeline: one round trip per decision.
-- KEYS: turn key, again key, fleet zset, group lease zset, a wake list (for another dispatcher), then
--       per pool: its requests list, its pool lease zset
-- ARGV: holder id, turn lease ms, fleet membership seconds, fleet member ("<holder id> <local slots>"),
--       local free slots once the claims before this script succeed, group limit, "1" when the round
--       left work for other dispatchers' slots, wake token cap, token TTL ms, then per pool: depth,
--       pool max, "1" to read the first item even when the pool cannot launch
-- Returns {turn, fleet members, group in flight, {backlog, in_flight_of_pool, heads_read, heads}...}
-- with heads_read as OBSERVE's. turn is 1 when the observation lets this dispatcher launch something
-- (some pool's heads were read for launching): the turn is its own until its next ROUND, so nobody
-- else decides meanwhile. 0 when it allows nothing: the turn is given back, a note left meanwhile
-- becomes a wake token, and so does work left for others' slots. -1 when another dispatcher holds the
-- turn: nothing is read, and the note left here makes the holder's release wake one of us.
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
for i = 6, #KEYS, 2 do
  local a = 10 + (i - 6) / 2 * 3
  local backlog = redis.call('LLEN', KEYS[i])
  local in_pool = redis.call('ZCARD', KEYS[i + 1])
  local depth = tonumber(ARGV[a])
  local open = backlog > 0 and in_pool < tonumber(ARGV[a + 1]) and in_group < limit
  if backlog == 0 then
    out[#out + 1] = {0, in_pool, 0, {}}
  elseif open and free > 0 and depth > 0 then
    launchable = true
    out[#out + 1] = {backlog, in_pool, 1, redis.call('LRANGE', KEYS[i], 0, depth - 1)}
  else
    wanted = wanted or open
    if ARGV[a + 2] == '1' then
      out[#out + 1] = {backlog, in_pool, 2, redis.call('LRANGE', KEYS[i], 0, 0)}
    else
      out[#out + 1] = {backlog, in_pool, 0, {}}
    end
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
