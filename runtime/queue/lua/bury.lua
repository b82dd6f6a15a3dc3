-- BURY: dead-letters a durable request found at its list's head after too many requeues, and tells
-- its producer, in one step, taking the head exactly as the claim does (by its digest).
-- KEYS: requests list, dead-letter list, producer alive key, replies list
-- ARGV: expected sha1 of the head, dead letter bytes, reply bytes, reply list TTL ms
-- Returns 1 when the head was dead-lettered, 0 when it had moved (someone else took it).
local head = redis.call('LINDEX', KEYS[1], 0)
if not head or redis.sha1hex(head) ~= ARGV[1] then return 0 end
redis.call('LPOP', KEYS[1])
--! bury_letter
return 1
