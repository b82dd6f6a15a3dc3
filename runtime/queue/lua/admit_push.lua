-- ADMIT_PUSH: the pool's admission limits (and an ingress key's own, first) checked, and the request
-- pushed, in one step: the depth it reads is the depth it pushes onto. The rule is
-- runtime.policy.admission.decide; runtime.queue.admission turns a refusal into QueueFull.
-- KEYS: requests list, wake key, drain hash, rejections hash, the backend's shared breaker state
--       (a key never written when the pool has no breaker), [the key's open-requests zset]
-- ARGV: envelope, wake token cap, wake token TTL ms, max_queued or '', max_queue_wait_s or '',
--       pool id, '1' when paused, the breaker's open seconds,
--       [key max_in_flight or '', key max_queued or '', lease member, lease seconds, pool-lease key prefix]
-- Returns {1, new length} when pushed; {0, reason, depth (or the key's count), drain rate as text,
-- seconds the backlog drained nothing as text} when refused.
local depth = redis.call('LLEN', KEYS[1])
--! admit leased=KEYS[6]
-- The push itself, as PUSH does it: RPUSH, and a wake token for one idle dispatcher when the request
-- made the list non-empty (the request itself when small); then the backlog starts now (`since`).
-- The key's lease is taken with the push: no request of the key is queued uncounted.
local n = redis.call('RPUSH', KEYS[1], ARGV[1])
if n == 1 then
--! wake_head key=KEYS[2] cap=ARGV[2] ttl=ARGV[3] head=ARGV[1]
  local st = redis.call('TIME')
  redis.call('HSET', KEYS[3], 'since', tonumber(st[1]) + tonumber(st[2]) / 1000000)
  redis.call('EXPIRE', KEYS[3], $DRAIN_TTL_S)
end
if KEYS[6] then
  redis.call('ZADD', KEYS[6], now + tonumber(ARGV[12]), ARGV[11])
  redis.call('EXPIRE', KEYS[6], $KEY_SET_TTL_S)
end
return {1, n}
