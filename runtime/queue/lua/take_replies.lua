-- TAKE REPLIES: the reply pump's take. Replies move from the reply list to its taken list and leave
-- that only once delivered, acknowledged with the next take, fenced by a sequence number so that a
-- take replayed on resume trims nothing twice. Sent as EVAL, source and all: the pump's connection is
-- its own, and a server restarted under it has no script cache to miss.
-- KEYS: reply list, taken list, ack key
-- ARGV: ack sequence, replies delivered since, batch, ttl ms
-- Returns the taken list (undelivered replies first, in order).
if tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[3]) or '0') then
  redis.call('LTRIM', KEYS[2], ARGV[2], -1)
  redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[4])
end
local room = tonumber(ARGV[3]) - redis.call('LLEN', KEYS[2])
if room > 0 then
  local more = redis.call('LPOP', KEYS[1], room)
  if more then redis.call('RPUSH', KEYS[2], unpack(more)) end
end
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return redis.call('LRANGE', KEYS[2], 0, -1)
