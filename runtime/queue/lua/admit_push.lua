-- ADMIT_PUSH: the pool's admission limits (and an ingress key's own, first) checked, and the request
-- pushed, in one step: the depth it reads is the depth it pushes onto. The rule is
-- runtime.policy.admission.decide; runtime.queue.admission turns a refusal into QueueFull.
-- KEYS: requests list, wake key, drain hash, rejections hash, the backend's shared breaker state
--       (a key never written when the pool has no breaker), [the key's open-requests zset (a key
--       nobody writes when the push has a ticket's keys but no key lease)], [for a claim against a
--       standing ticket, as PUSH's: ticket list, producer alive key, pool lease zset, group lease zset,
--       durable envelopes hash]
-- ARGV: envelope, wake token cap, wake token TTL ms, max_queued or '', max_queue_wait_s or '',
--       pool id, '1' when paused, the breaker's open seconds,
--       [key max_in_flight or '', key max_queued or '', lease member, lease seconds, pool-lease key prefix],
--       [with the ticket's keys: '1' when the key's lease is real, else '', the request's lease member]
-- Returns {1, new length} when pushed (0: claimed against a ticket, as PUSH); {0, reason, depth (or
-- the key's count), drain rate as text, seconds the backlog drained nothing as text} when refused.
local depth = redis.call('LLEN', KEYS[1])
local leased = KEYS[6] ~= nil and ARGV[14] ~= ''
--! admit leased=leased
-- The push itself, as PUSH does it: RPUSH, and when the request made the list non-empty the claim
-- against a standing ticket, or else a wake token for one idle dispatcher (the request itself when
-- small) and the backlog starts now (`since`).
-- The key's lease is taken with the push: no request of the key is queued uncounted.
local n = redis.call('RPUSH', KEYS[1], ARGV[1])
local claimed = false
if n == 1 and KEYS[7] then
--! ticket_claim requests=KEYS[1] tickets=KEYS[7] alive=KEYS[8] pool=KEYS[9] drain=KEYS[3] group=KEYS[10] durable=KEYS[11] envelope=ARGV[1] member=ARGV[15]
end
if n == 1 and not claimed then
--! wake_head key=KEYS[2] cap=ARGV[2] ttl=ARGV[3] head=ARGV[1]
  local st = redis.call('TIME')
  redis.call('HSET', KEYS[3], 'since', tonumber(st[1]) + tonumber(st[2]) / 1000000)
  redis.call('EXPIRE', KEYS[3], $DRAIN_TTL_S)
end
if leased then
  redis.call('ZADD', KEYS[6], now + tonumber(ARGV[12]), ARGV[11])
  redis.call('EXPIRE', KEYS[6], $KEY_SET_TTL_S)
end
return {1, claimed and 0 or n}
