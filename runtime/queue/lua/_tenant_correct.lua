-- TENANT_CORRECT: a fair pool's finished call corrects its tenant's counter by (actual - estimate) /
-- weight (runtime.policy.tenants.TenantCost.correction), its score too while it is backlogged (XX: a
-- tenant that left stays out), and adds what the call was served (its usage's cost, or its estimate
-- when the backend reported none) to the served hash. Increments commute: corrections from any
-- number of dispatchers never drift. Params: zset, counters, served, tenant, charge (the correction /
-- weight), cost (the cost served, before the weight).
if tonumber($charge) ~= 0 then
  redis.call('HINCRBYFLOAT', $counters, $tenant, $charge)
  redis.call('ZADD', $zset, 'XX', 'INCR', $charge, $tenant)
end
if tonumber($cost) ~= 0 then redis.call('HINCRBYFLOAT', $served, $tenant, $cost) end
