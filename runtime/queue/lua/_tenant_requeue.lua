-- TENANT_REQUEUE: a fair pool's request put back at the head of its tenant's list (the envelope's
-- `tenant`; untagged: the seed's list as tenant '*'), counted in the pool's queued count; the tenant
-- enters when its list was empty. Params: envelope, seed (the pool's own list), lists (the pool's
-- tenant lists' key up to the tenant), zset, counters, count.
do
  local ok, decoded = pcall(cjson.decode, $envelope)
  local tenant = '*'
  if ok and type(decoded) == 'table' and type(decoded.tenant) == 'string' then tenant = decoded.tenant end
  local list = tenant == '*' and $seed or $lists .. tenant
  redis.call('INCR', $count)
  if redis.call('LPUSH', list, $envelope) == 1 then
--! enter zset=$zset counters=$counters tenant=tenant
  end
end
