-- PUSH: the producer's plain push; wakes one idle dispatcher when the request made the list non-empty
-- (the token is the request itself when small: see runtime.queue.keys.WAKE_HEAD_MAX_BYTES).
-- KEYS: requests list, wake list
-- ARGV: envelope bytes, token cap, token ttl ms
-- Returns the new length.
local n = redis.call('RPUSH', KEYS[1], ARGV[1])
if n == 1 then
--! wake_head key=KEYS[2] cap=ARGV[2] ttl=ARGV[3] head=ARGV[1]
end
return n
