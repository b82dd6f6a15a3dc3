-- PUSH: the producer's plain push. A request that made the list non-empty is claimed at once for the
-- idle dispatcher whose standing claim ticket is oldest in the pool's ticket list, when the caps allow
-- (runtime.dispatch.tickets): its lease is taken and the request handed to that dispatcher's inbox (a
-- key not in KEYS: the ticket names it), so the call starts without a claim round trip. Otherwise
-- the push wakes one idle dispatcher (the token is the request itself when small: see
-- runtime.queue.keys.WAKE_HEAD_MAX_BYTES).
-- A ticket's claim stores the request as its lease's envelope to requeue until the dispatcher accepts
-- it from its inbox: if that dispatcher died meanwhile, REAP puts the request back at the head of its
-- list when the lease expires, as a durable group's. The accept writes the lease record (the claim
-- writes none: the producer does not know the dispatcher's cost model).
-- KEYS: requests list, wake list; for a claim against a ticket also: ticket list, producer alive key,
--       pool lease zset, group lease zset, durable envelopes hash, pool drain hash
-- ARGV: envelope bytes, token cap, token ttl ms; with the ticket keys also the lease member
-- A ticket is NUL-separated: inbox, pool max, group limit, lease seconds; for a pool behind a backend row
-- also the backend's fleet lease zset, its 429 hold key, its breaker key (keys not in KEYS, as the
-- inbox) and its in-flight limit: the claim then checks them as CLAIM does, and also that the shared
-- breaker is closed (else only a round claims: a half-open breaker's probe is taken there). The inbox gets
-- `<lease member>\0<request>`.
-- Returns the new length (0: claimed against a ticket).
local n = redis.call('RPUSH', KEYS[1], ARGV[1])
if n == 1 then
  local claimed = false
  if KEYS[3] then
--! ticket_claim requests=KEYS[1] tickets=KEYS[3] alive=KEYS[4] pool=KEYS[5] group=KEYS[6] durable=KEYS[7] drain=KEYS[8] envelope=ARGV[1] member=ARGV[4]
  end
  if claimed then return 0 end
--! wake_head key=KEYS[2] cap=ARGV[2] ttl=ARGV[3] head=ARGV[1]
end
return n
