-- RENEW: extends a dispatcher's lease only if it still exists (XX), so a lease reaped after expiry is
-- not revived.
-- KEYS: group lease zset, pool lease zset, backend lease zset
-- ARGV: new expiry offset seconds, member
local t = redis.call('TIME')
local expiry = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[1])
redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[2])
redis.call('ZADD', KEYS[2], 'XX', expiry, ARGV[2])
redis.call('ZADD', KEYS[3], 'XX', expiry, ARGV[2])
return 1
