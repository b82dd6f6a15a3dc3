-- TENANT_PUSH_PLAIN: TENANT_PUSH with nothing to check (the pool has no admission limits, the submit no
-- ingress key lease, the pool no max_queued_per_tenant): what PUSH is to ADMIT_PUSH. Seven keys and
-- five arguments instead of eleven and seventeen, and no read of the queued count: the common fair
-- push costs about the seed's (bench/bench_tenants.py --part cost).
-- KEYS: the tenant's list, wake key, drain hash, backlogged tenants zset, counters hash, weights hash,
--       the pool's queued count
-- ARGV: envelope bytes, token cap, token ttl ms, tenant, weight
-- Returns {1, the pool's queued count}, as TENANT_PUSH's admitted push.
--! tenant_queue list=KEYS[1] envelope=ARGV[1] count=KEYS[7] weights=KEYS[6] tenant=ARGV[4] weight=ARGV[5] zset=KEYS[4] counters=KEYS[5] wake=KEYS[2] cap=ARGV[2] ttl=ARGV[3] drain=KEYS[3]
return {1, total}
