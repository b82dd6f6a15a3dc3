-- TENANT_PROMOTE: PROMOTE in a fair pool: each due retry goes back to the head of its tenant's list
-- (the envelope's `tenant`; untagged: the seed's list as tenant '*'), counted in the pool's queued
-- count; a tenant whose list was empty enters the backlogged set.
-- KEYS: delayed zset, the seed's list, wake list, backlogged tenants zset, counters hash, queued count
-- ARGV: batch size, wake token cap, token TTL ms, the tenant lists' key prefix
-- Returns how many due retries went back.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
if #due == 0 then return 0 end
for i = #due, 1, -1 do
  local ok, envelope = pcall(cjson.decode, due[i])
  local tenant = '*'
  if ok and type(envelope) == 'table' and type(envelope.tenant) == 'string' then tenant = envelope.tenant end
  local list = tenant == '*' and KEYS[2] or ARGV[4] .. tenant
  redis.call('INCR', KEYS[6])
  if redis.call('LPUSH', list, due[i]) == 1 then
--! enter zset=KEYS[4] counters=KEYS[5] tenant=tenant
  end
end
redis.call('ZREM', KEYS[1], unpack(due))
--! wake key=KEYS[3] cap=ARGV[2] ttl=ARGV[3]
return #due
