-- ADMIT: the admission checks of ADMIT_PUSH (an ingress key's limits, then the pool's), shared with
-- TENANT_PUSH. KEYS and ARGV as ADMIT_PUSH declares them; the including script defines `depth` (the
-- pool's queued requests) first, and `$leased` is true when KEYS[6] is the key's open-requests zset.
-- A refusal returns from the script; otherwise `now` holds the time the key's lease starts.
local now = 0
if $leased then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
  local open = redis.call('ZRANGE', KEYS[6], 0, -1)
  local reason, count = nil, #open
  local most_open, most_queued = tonumber(ARGV[9]), tonumber(ARGV[10])
  if most_open and #open >= most_open then reason = '$REASON_KEY_IN_FLIGHT' end
  if not reason and most_queued and #open >= most_queued then
    -- Not started: no dispatcher's lease in its pool (the member is the lease's, pool id first).
    count = 0
    for _, member in ipairs(open) do
      local cut = string.find(member, string.char(31), 1, true)
      local leased = cut and redis.call('ZSCORE', ARGV[13] .. string.sub(member, 1, cut - 1), member)
      if not leased then count = count + 1 end
    end
    if count >= most_queued then reason = '$REASON_KEY_QUEUED' end
  end
  if reason then
    redis.call('HINCRBY', KEYS[4], ARGV[6] .. ':' .. reason, 1)
    return {0, reason, count, '0', '0'}
  end
end
local function drain_rate()
  local now = tonumber(redis.call('TIME')[1])
  local fields = {}
  for i = 0, $DRAIN_RING - 1 do
    fields[#fields + 1] = 's' .. i
    fields[#fields + 1] = 'c' .. i
  end
  local v = redis.call('HMGET', KEYS[3], unpack(fields))
  local total = 0
  for i = 0, $DRAIN_RING - 1 do
    local s = tonumber(v[2 * i + 1])
    if s and s >= now - $DRAIN_WINDOW_S and s <= now - 1 then total = total + (tonumber(v[2 * i + 2]) or 0) end
  end
  return total / $DRAIN_WINDOW_S
end
local reason, rate = nil, nil
local max_queued = tonumber(ARGV[4])
if max_queued and depth >= max_queued then
  reason = 'max_queued'
end
local max_wait = tonumber(ARGV[5])
local idle = 0
if not reason and max_wait then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  local raw = KEYS[5] and redis.call('GET', KEYS[5])
  local ok, breaker = pcall(cjson.decode, raw or '')
  if ARGV[7] == '1' then
    reason = 'paused'
  elseif ok and type(breaker) == 'table' and breaker.mode == 'open'
      and now < (tonumber(breaker.since) or 0) + tonumber(ARGV[8]) then
    reason = 'breaker_open'
  elseif depth > 0 then
    local v = redis.call('HMGET', KEYS[3], 'last', 'since')
    local since = tonumber(v[2])
    if not since then
      since = now
      redis.call('HSET', KEYS[3], 'since', now)
    end
    idle = now - math.max(since, tonumber(v[1]) or 0)
    if idle > max_wait then reason = 'not_draining' end
  end
end
if not reason and max_wait and depth > 0 then
  rate = drain_rate()
  if rate > 0 and depth / rate > max_wait then reason = 'max_queue_wait' end
end
if reason then
  redis.call('HINCRBY', KEYS[4], ARGV[6] .. ':' .. reason, 1)
  return {0, reason, depth, tostring(rate or drain_rate()), tostring(idle)}
end
