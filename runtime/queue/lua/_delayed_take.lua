-- DELAYED_TAKE: a withdrawal's search of the pool's delayed set (KEYS[2]) for the request's retry,
-- stored as its next attempt's envelope, so found by the start of its envelopes (ARGV[3]); sets
-- `removed` when it took one.
  for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    if string.sub(member, 1, #ARGV[3]) == ARGV[3] then
      removed = redis.call('ZREM', KEYS[2], member)
      break
    end
  end
