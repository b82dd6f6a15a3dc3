-- PUSH: the producer's plain push; wakes one idle dispatcher when the request made the list non-empty.
-- KEYS: requests list, wake list
-- ARGV: envelope bytes, token cap, token ttl ms
-- Returns the new length.
local n = redis.call('RPUSH', KEYS[1], ARGV[1])
if n == 1 then
--! wake key=KEYS[2] cap=ARGV[2] ttl=ARGV[3]
end
return n
