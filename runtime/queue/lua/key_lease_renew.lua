-- KEY LEASE RENEW: renews a producer's key leases still held (ZADD XX: one released meanwhile is not
-- brought back).
-- KEYS: a key's open-requests zset
-- ARGV: pairs of lease member, seconds from now
-- Returns how many leases were renewed.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local renewed = 0
for i = 1, #ARGV, 2 do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[i + 1]), ARGV[i])
end
redis.call('EXPIRE', KEYS[1], $KEY_SET_TTL_S)
return renewed
