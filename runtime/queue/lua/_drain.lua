-- Fragment (included as `--! drain key=... count=... time=...`): count $count requests that left the
-- queue now in the ring of per-second buckets of the drain hash $key (admission control reads it).
-- $time is the TIME reply to count at: a script that asked for TIME already passes its reply (one
-- TIME per call), others `redis.call('TIME')`.
do
  local dt = $time
  local dsec = tonumber(dt[1])
  local slot = dsec % $DRAIN_RING
  if redis.call('HGET', $key, 's' .. slot) ~= tostring(dsec) then
    redis.call('HSET', $key, 's' .. slot, dsec, 'c' .. slot, 0)
    -- The TTL is renewed as a second's bucket starts (a new hash included), not at every count: one
    -- command less per claim, and the hash outlives its last drain by DRAIN_TTL_S less under a second.
    redis.call('EXPIRE', $key, $DRAIN_TTL_S)
  end
  redis.call('HINCRBY', $key, 'c' .. slot, $count)
  redis.call('HSET', $key, 'last', tonumber(dt[1]) + tonumber(dt[2]) / 1000000)
end
