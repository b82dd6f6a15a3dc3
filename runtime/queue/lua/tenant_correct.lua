-- TENANT_CORRECT: a fair pool's completion corrects its tenant's counter by (actual - estimate) / weight
-- (runtime.policy.tenants.TenantCost.correction); its score too while it is backlogged. Increments
-- commute: corrections from any number of dispatchers never drift.
-- KEYS: backlogged tenants zset, counters hash
-- ARGV: tenant, the correction
-- Returns nothing.
redis.call('HINCRBYFLOAT', KEYS[2], ARGV[1], ARGV[2])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then redis.call('ZINCRBY', KEYS[1], ARGV[2], ARGV[1]) end
return 0
