-- TENANT_FORGET: a fair pool's idle cleanup, a slice per reap: HSCAN the counters hash from the cursor
-- kept in a key and drop each idle tenant (not backlogged) whose counter is at or below the floor, and
-- its weight: it would re-enter at the floor anyway (runtime.policy.tenants.TenantLedger.forget_idle).
-- A tenant forgotten with a call still in flight gets that call's correction on a fresh counter, which
-- its re-entry lifts to the floor: off by at most that one correction.
-- KEYS: counters hash, backlogged tenants zset, weights hash, the scan's cursor key
-- ARGV: fields to scan per call
-- Returns how many tenants were forgotten.
local low = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local floor = tonumber(low[2]) or tonumber(redis.call('HGET', KEYS[1], '*last')) or 0
local scan = redis.call('HSCAN', KEYS[1], redis.call('GET', KEYS[4]) or '0', 'COUNT', ARGV[1])
local fields, forgotten = scan[2], 0
for i = 1, #fields, 2 do
  local tenant = fields[i]
  if tenant ~= '*last' and tonumber(fields[i + 1]) <= floor and not redis.call('ZSCORE', KEYS[2], tenant) then
    redis.call('HDEL', KEYS[1], tenant)
    redis.call('HDEL', KEYS[3], tenant)
    forgotten = forgotten + 1
  end
end
if scan[1] == '0' then redis.call('DEL', KEYS[4]) else redis.call('SET', KEYS[4], scan[1]) end
return forgotten
