-- ANSWER_GONE: error replies queued for one producer whose calls a claim dropped as producer_gone
-- (its liveness marker missing: never run). Unlike every other reply, without checking that marker:
-- a producer that is alive but whose marker lapsed for a moment reads them and fails its callers at
-- once instead of at their timeouts; a producer that is really gone never reads them, and its list
-- expires after the reply list TTL as any reply list does.
-- KEYS: replies list
-- ARGV: reply list TTL ms, then the reply bytes, one per dropped call
-- Returns the list's length after the push.
local n = redis.call('RPUSH', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return n
