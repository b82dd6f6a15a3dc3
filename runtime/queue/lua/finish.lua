-- FINISH: settles an attempt (reply, retry, dead letter or requeue) and releases its leases.
-- KEYS: producer alive key, replies list, group lease zset, pool lease zset, lease records hash,
--       pool wake list, fencing tokens hash, durable envelopes hash, delayed zset, dead-letter list,
--       backend lease zset, the pool's requests list, the group's turn key and turn-again key, then the
--       requests list of every pool of the group (a fair pool's: its backlogged tenants zset; either
--       exists only while the pool has backlog)
-- ARGV: reply bytes (empty: release only), reply list TTL ms, lease member, wake token cap, token TTL ms,
--       fencing token ('' unfenced: lists mode), settlement (SETTLE_*), the retry's next envelope or the
--       dead letter, the retry's due time, then only for a fair pool (tenant_fairness on): its tenant
--       lists' key up to the tenant, its backlogged tenants zset, counters hash, queued count (a
--       requeue goes to the tenant's list) and, for a charged call (lua/_tenant_correct.lua, not when
--       stale): the tenant, the correction / weight, the cost served, the served hash
-- Returns FINISH_DELIVERED, FINISH_PRODUCER_GONE, FINISH_STALE (the lease was taken away: nothing
-- done, not even the backend's lease), FINISH_DELAYED (the retry waits in the delayed set) or
-- FINISH_REQUEUED (a durable call its dispatcher could not finish before shutting down went back to
-- the head of its pool's list, as an expired lease's would, without waiting for the lease to expire).
-- While the group has backlog, the freed slot wakes one idle dispatcher of the group (the one
-- waiting longest), not necessarily the finisher, so the work spreads over the fleet. While another
-- dispatcher holds the group's turn, a token would only wake one into a round that finds it taken: the
-- note is left instead, and the turn's release turns it into the token.
if ARGV[6] ~= '' and redis.call('HGET', KEYS[7], ARGV[3]) ~= ARGV[6] then return -1 end
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
redis.call('HDEL', KEYS[5], ARGV[3])
if ARGV[6] ~= '' then
  -- Only a fenced (durable) claim wrote a token and an envelope (lua/_claim.lua): an unfenced claim's
  -- member has neither, since a live durable lease of the same member refuses its claim (duplicate)
  -- and every end of one (FINISH, REAP, GIVE_BACK) deletes both.
  redis.call('HDEL', KEYS[7], ARGV[3])
  redis.call('HDEL', KEYS[8], ARGV[3])
end
redis.call('ZREM', KEYS[11], ARGV[3])
if ARGV[14] then
--! tenant_correct zset=ARGV[11] counters=ARGV[12] served=ARGV[17] tenant=ARGV[14] charge=ARGV[15] cost=ARGV[16]
end
if ARGV[7] == 'requeue' then
  if ARGV[10] then
--! tenant_requeue envelope=ARGV[8] seed=KEYS[12] lists=ARGV[10] zset=ARGV[11] counters=ARGV[12] count=ARGV[13]
  else
    redis.call('LPUSH', KEYS[12], ARGV[8])
  end
end
for i = 15, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    if redis.call('EXISTS', KEYS[13]) == 1 then
      redis.call('SET', KEYS[14], '1', 'PX', $TURN_LEASE_MS)
    else
--! wake key=KEYS[6] cap=ARGV[4] ttl=ARGV[5]
    end
    break
  end
end
if ARGV[7] == 'retry' then
  redis.call('ZADD', KEYS[9], ARGV[9], ARGV[8])
  return 2
end
if ARGV[7] == 'requeue' then return 3 end
if ARGV[7] == 'dead' then redis.call('RPUSH', KEYS[10], ARGV[8]) end
if ARGV[1] == '' then return 1 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
