-- REAP: drops leases past their expiry (a killed or frozen dispatcher's), so observation counts only
-- live ones. A durable lease's envelope goes back to the head of its pool's list (earliest claim
-- first): a requeue. Any other expired lease with a record is a call lost in flight (a durable stream
-- whose first chunk reached its producer gave its envelope up: its record says `streamed`). Every
-- expired lease loses its fencing token, so its dispatcher, if it still runs, can neither relay nor
-- finish.
-- KEYS: the group lease zset, the lease records hash, the durable envelopes hash, the fencing tokens
--       hash, then every pool lease zset of the group and the lease zsets of its backends
-- ARGV: the requests-list key of a pool without its pool id (the key prefix up to it), then only when
--       the group has fair pools (tenant_fairness on): the same prefixes of a pool's tenant lists, its
--       backlogged tenants zset, counters hash and queued count, then the fair pools' ids. A fair
--       pool's request goes back to its tenant's list (the envelope's `tenant`; untagged: the seed's
--       list as tenant '*'), counted, the tenant entering when its list was empty.
-- Returns {records of the lost calls, requeued envelopes}.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
local lost = {}
local requeued = {}
local fair = {}
for i = 6, #ARGV do fair[ARGV[i]] = true end
local function requeue(pool, envelope)
  if not fair[pool] then
    redis.call('LPUSH', ARGV[1] .. pool, envelope)
    return
  end
  local seed, lists, zset, counters, count = ARGV[1] .. pool, ARGV[2] .. pool .. ':', ARGV[3] .. pool,
    ARGV[4] .. pool, ARGV[5] .. pool
--! tenant_requeue envelope=envelope seed=seed lists=lists zset=zset counters=counters count=count
end
for i = #expired, 1, -1 do
  local member = expired[i]
  local envelope = redis.call('HGET', KEYS[3], member)
  if envelope then
    local pool = string.match(member, '^(.-)\031')
    requeue(pool, envelope)
    redis.call('HDEL', KEYS[3], member)
    requeued[#requeued + 1] = envelope
  else
    local record = redis.call('HGET', KEYS[2], member)
    if record then lost[#lost + 1] = record end
  end
  redis.call('HDEL', KEYS[4], member)
  redis.call('HDEL', KEYS[2], member)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
for i = 5, #KEYS do redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now) end
return {lost, requeued}
