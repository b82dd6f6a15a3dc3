-- LEAVE: a tenant whose list is now empty stops competing; its counter is remembered as the last
-- leaver's (runtime.policy.tenants.TenantLedger.leave). Params: zset, counters, tenant.
if redis.call('ZREM', $zset, $tenant) == 1 then
  redis.call('HSET', $counters, '*last', redis.call('HGET', $counters, $tenant) or 0)
end
