-- WITHDRAW: removes the queued request, or its retry waiting in the delayed set (stored as its next
-- attempt's envelope, so found by id), and counts it.
-- KEYS: the pool's list, its delayed set and, when its group is known, the group's counters
-- ARGV: the envelope, the counter's field, the start of the request's envelopes (its id is the first
--       field)
-- Returns how many were removed.
local removed = redis.call('LREM', KEYS[1], 1, ARGV[1])
if removed == 0 then
--! delayed_take
end
if removed > 0 and KEYS[3] then redis.call('HINCRBY', KEYS[3], ARGV[2], 1) end
return removed
