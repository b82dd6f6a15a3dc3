-- PROMOTE: moves due retries from the pool's delayed set back to the head of its list (earliest due
-- first) and wakes one dispatcher of the group.
-- KEYS: delayed zset, requests list, wake list
-- ARGV: batch size, wake token cap, token TTL ms
-- Returns how many due retries went back to the head of the list.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
if #due == 0 then return 0 end
for i = #due, 1, -1 do redis.call('LPUSH', KEYS[2], due[i]) end
redis.call('ZREM', KEYS[1], unpack(due))
--! wake key=KEYS[3] cap=ARGV[2] ttl=ARGV[3]
return #due
