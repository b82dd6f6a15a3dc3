-- Fragment (included as `--! ticket_claim requests=... tickets=... alive=... pool=... drain=... group=...
-- durable=... envelope=... member=...`): the claim of a push whose request made the pool's list
-- $requests non-empty against the oldest standing ticket in $tickets (see lua/push.lua, which declares
-- the ticket), checking the caps, the duplicate lease, the producer's liveness ($alive) and, behind a
-- backend row, the backend's hold, limit and breaker. Sets the includer's `claimed` to true when the
-- request went to the ticket's inbox, its leases taken ($pool, $group, the backend's), counted in
-- $drain and stored in $durable as its lease's envelope to requeue; a ticket the caps refused stands.
do
  local ticket = redis.call('LPOP', $tickets)
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
        and redis.call('ZCARD', $pool) < pool_max and redis.call('ZCARD', $group) < group_limit
        and not redis.call('ZSCORE', $pool, $member) and redis.call('EXISTS', $alive) == 1
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
      redis.call('ZADD', $group, expiry, $member)
      redis.call('ZADD', $pool, expiry, $member)
      if backend_limit then redis.call('ZADD', backend, expiry, $member) end
      redis.call('HSET', $durable, $member, $envelope)
      redis.call('LPOP', $requests)
--! drain key=$drain count=1 time=t
      redis.call('RPUSH', inbox, $member .. '\0' .. $envelope)
      redis.call('PEXPIRE', inbox, $TICKET_TTL_MS)
      claimed = true
    end
    if wellformed and not claimed then
      redis.call('LPUSH', $tickets, ticket)  -- still standing: the caps refused, not the dispatcher
    end
  end
end
