-- TENANT_DEAD_LETTER_TAKE: DEAD_LETTER_TAKE in a fair pool: the replayed request goes to the tail of
-- its tenant's list (untagged: the seed's list as tenant '*'), counted in the pool's queued count; the
-- tenant enters the backlogged set when its list was empty.
-- KEYS: dead-letter list, the seed's list, backlogged tenants zset, counters hash, the pool's queued
--       count
-- ARGV: stored dead letter bytes, envelope to queue ('' = discard), the tenant lists' key up to the
--       tenant, the tenant ('*' untagged)
-- Returns 1 when the letter was there (and was replayed or discarded), 0 when someone else took it.
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
if ARGV[2] ~= '' then
  local list = ARGV[4] == '*' and KEYS[2] or ARGV[3] .. ARGV[4]
  redis.call('INCR', KEYS[5])
  if redis.call('RPUSH', list, ARGV[2]) == 1 then
--! enter zset=KEYS[3] counters=KEYS[4] tenant=ARGV[4]
  end
end
return 1
