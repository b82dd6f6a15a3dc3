-- PUSH: the producer's plain push. A request that made the list non-empty is claimed at once for the
-- idle dispatcher whose standing claim ticket is oldest in the pool's ticket list, when the caps allow
-- (runtime.dispatch.tickets): its lease is taken and the request handed to that dispatcher's inbox (a
-- key not in KEYS: the ticket names it), so the call starts without a claim round trip. Otherwise
-- the push wakes one idle dispatcher (the token is the request itself when small: see
-- runtime.queue.keys.WAKE_HEAD_MAX_BYTES).
-- A ticket's claim stores the request as its lease's envelope to requeue until the dispatcher accepts
-- it from its inbox: if that dispatcher died meanwhile, REAP puts the request back at the head of its
-- list when the lease expires, as a durable group's. The accept writes the lease record (the claim
-- writes none: the producer does not know the dispatcher's cost model).
-- KEYS: requests list, wake list; for a claim against a ticket also: ticket list, producer alive key,
--       pool lease zset, pool drain hash, group lease zset, durable envelopes hash
-- ARGV: envelope bytes, token cap, token ttl ms; with the ticket keys also the lease member
-- A ticket is NUL-separated: inbox, pool max, group limit, lease seconds; for a pool behind a backend row
-- also the backend's fleet lease zset, its 429 hold key, its breaker key (keys not in KEYS, as the
-- inbox) and its in-flight limit: the claim then checks them as CLAIM does, and also that the shared
-- breaker is closed (else only a round claims: a half-open breaker's probe is taken there). The inbox gets
-- `<lease member>\0<request>`.
-- Returns the new length (0: claimed against a ticket).
local n = redis.call('RPUSH', KEYS[1], ARGV[1])
if n == 1 then
  local ticket = KEYS[3] and redis.call('LPOP', KEYS[3])
  if ticket then
    local f, at = {}, 1
    while true do
      local nul = string.find(ticket, '\0', at, true)
      f[#f + 1] = string.sub(ticket, at, nul and nul - 1)
      if not nul then break end
      at = nul + 1
    end
    local inbox, pool_max, group_limit, lease_s = f[1], tonumber(f[2]), tonumber(f[3]), tonumber(f[4])
    local backend, hold, breaker_key, backend_limit = f[5], f[6], f[7], tonumber(f[8])
    local wellformed = pool_max and group_limit and lease_s and (#f == 4 or (#f == 8 and backend_limit))
    local ok = wellformed
        and redis.call('ZCARD', KEYS[5]) < pool_max and redis.call('ZCARD', KEYS[7]) < group_limit
        and not redis.call('ZSCORE', KEYS[5], ARGV[4]) and redis.call('EXISTS', KEYS[4]) == 1
    local t = ok and redis.call('TIME')
    local now = t and tonumber(t[1]) + tonumber(t[2]) / 1000000
    if ok and backend_limit then
      local raw = redis.call('GET', breaker_key)
      local readable, breaker = pcall(cjson.decode, raw or '{"mode":"closed"}')
      ok = readable and type(breaker) == 'table' and breaker.mode == 'closed'
          and redis.call('EXISTS', hold) == 0
      if ok then
        redis.call('ZREMRANGEBYSCORE', backend, '-inf', now)
        ok = redis.call('ZCARD', backend) < backend_limit
      end
    end
    if ok then
      local expiry = now + lease_s
      redis.call('ZADD', KEYS[7], expiry, ARGV[4])
      redis.call('ZADD', KEYS[5], expiry, ARGV[4])
      if backend_limit then redis.call('ZADD', backend, expiry, ARGV[4]) end
      redis.call('HSET', KEYS[8], ARGV[4], ARGV[1])
      redis.call('LPOP', KEYS[1])
--! drain key=KEYS[6] count=1 time=t
      redis.call('RPUSH', inbox, ARGV[4] .. '\0' .. ARGV[1])
      redis.call('PEXPIRE', inbox, $TICKET_TTL_MS)
      return 0
    end
    if wellformed then redis.call('LPUSH', KEYS[3], ticket) end  -- the caps refused, not the dispatcher
  end
--! wake_head key=KEYS[2] cap=ARGV[2] ttl=ARGV[3] head=ARGV[1]
end
return n
