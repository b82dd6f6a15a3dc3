-- PUSH: the producer's plain push. A request that made the list non-empty is claimed at once for the
-- idle dispatcher whose standing claim ticket is oldest in the pool's ticket list, when the caps allow
-- (runtime.dispatch.tickets): its lease is taken and the request handed to that dispatcher's inbox (the
-- one key not in KEYS: the ticket names it), so the call starts without a claim round trip. Otherwise
-- the push wakes one idle dispatcher (the token is the request itself when small: see
-- runtime.queue.keys.WAKE_HEAD_MAX_BYTES).
-- A ticket's claim stores the request as its lease's envelope to requeue until the dispatcher accepts
-- it from its inbox: if that dispatcher died meanwhile, REAP puts the request back at the head of its
-- list when the lease expires, as a durable group's. The accept writes the lease record (the claim
-- writes none: the producer does not know the dispatcher's cost model).
-- KEYS: requests list, wake list; for a claim against a ticket also: ticket list, producer alive key,
--       pool lease zset, pool drain hash, group lease zset, durable envelopes hash
-- ARGV: envelope bytes, token cap, token ttl ms; with the ticket keys also the lease member
-- A ticket is `<inbox>|<pool max>|<group limit>|<lease seconds>`; the inbox gets `<lease member>\0<request>`.
-- Returns the new length (0: claimed against a ticket).
local n = redis.call('RPUSH', KEYS[1], ARGV[1])
if n == 1 then
  local ticket = KEYS[3] and redis.call('LPOP', KEYS[3])
  if ticket then
    local inbox, pool_max, group_limit, lease_s = string.match(ticket, '^(.+)|(%d+)|(%d+)|([%d.]+)')
    if inbox and redis.call('ZCARD', KEYS[5]) < tonumber(pool_max)
        and redis.call('ZCARD', KEYS[7]) < tonumber(group_limit)
        and not redis.call('ZSCORE', KEYS[5], ARGV[4]) and redis.call('EXISTS', KEYS[4]) == 1 then
      local t = redis.call('TIME')
      local expiry = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(lease_s)
      redis.call('ZADD', KEYS[7], expiry, ARGV[4])
      redis.call('ZADD', KEYS[5], expiry, ARGV[4])
      redis.call('HSET', KEYS[8], ARGV[4], ARGV[1])
      redis.call('LPOP', KEYS[1])
--! drain key=KEYS[6] count=1 time=t
      redis.call('RPUSH', inbox, ARGV[4] .. '\0' .. ARGV[1])
      redis.call('PEXPIRE', inbox, $TICKET_TTL_MS)
      return 0
    end
    redis.call('LPUSH', KEYS[3], ticket)  -- still standing: the caps refused, not the dispatcher
  end
--! wake_head key=KEYS[2] cap=ARGV[2] ttl=ARGV[3] head=ARGV[1]
end
return n
