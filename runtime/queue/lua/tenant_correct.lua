-- TENANT_CORRECT: a fair pool's completion corrects its tenant's counter by (actual - estimate) / weight
-- (runtime.policy.tenants.TenantCost.correction); its score too while it is backlogged. Increments
-- commute: corrections from any number of dispatchers never drift.
-- KEYS: backlogged tenants zset, counters hash, served hash
-- ARGV: tenant, the correction / weight, the correction
-- Returns nothing.
redis.call('HINCRBYFLOAT', KEYS[2], ARGV[1], ARGV[2])
redis.call('HINCRBYFLOAT', KEYS[3], ARGV[1], ARGV[3])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then redis.call('ZINCRBY', KEYS[1], ARGV[2], ARGV[1]) end
return 0
