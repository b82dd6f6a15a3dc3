-- TICKET_RETURN: gives back a request a push claimed against this dispatcher's standing ticket and that
-- it will not run (stopping, its pool disabled or paused since, its breaker opened, malformed): the
-- lease goes, and the request back to the head of its list, waking one idle dispatcher when the list
-- was empty. Nothing is done when the claim's requeue entry is gone (REAP requeued it already, or the
-- request was accepted).
-- KEYS: requests list, wake list, group lease zset, pool lease zset, durable envelopes hash; for a pool
--       behind a backend row also the backend's lease zset
-- ARGV: lease member, the request, token cap, token ttl ms
-- Returns 1 when given back, else 0.
if redis.call('HDEL', KEYS[5], ARGV[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
if KEYS[6] then redis.call('ZREM', KEYS[6], ARGV[1]) end
if redis.call('LPUSH', KEYS[1], ARGV[2]) == 1 then
--! wake_head key=KEYS[2] cap=ARGV[3] ttl=ARGV[4] head=ARGV[2]
end
return 1
