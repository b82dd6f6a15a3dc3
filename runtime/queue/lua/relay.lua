-- RELAY: one streamed chunk (or an unfenced answer) queued for its producer.
-- KEYS: producer alive key, replies list, fencing tokens hash, lease records hash, durable envelopes hash
-- ARGV: chunk bytes, reply list TTL ms, lease member, fencing token ('' unfenced: lists mode), the
--       lease record marked streamed ('' but on a durable call's first chunk)
-- Returns 1 when the chunk was queued for the producer, 0 when the producer is gone, -1 when the lease
-- is no longer this attempt's (it expired: the request was requeued or answered), and nothing is sent.
if ARGV[4] ~= '' and redis.call('HGET', KEYS[3], ARGV[3]) ~= ARGV[4] then return -1 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[5] ~= '' then
  redis.call('HDEL', KEYS[5], ARGV[3])
  redis.call('HSET', KEYS[4], ARGV[3], ARGV[5])
end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
