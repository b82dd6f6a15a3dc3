-- TURN ACQUIRE: takes the group's scheduling turn, and reads the fleet.
-- KEYS: turn key, again key, fleet zset
-- ARGV: holder id, lease ms, fleet membership seconds, fleet member ("<holder id> <local slots>")
-- Returns {1 when the turn is ours, the fleet's members: the dispatchers of the group seen within the
-- membership seconds}.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local fleet = redis.call('ZRANGE', KEYS[3], 0, -1)
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, fleet} end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return {0, fleet}
