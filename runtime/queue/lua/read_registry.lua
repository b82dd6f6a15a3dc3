-- READ REGISTRY: the pool registry and the configuration of every group it names, in one round trip
-- (a script, so a cancelled reader is cancelled at once: redis-py's own commands can swallow the
-- cancellation).
-- KEYS: pool registry hash
-- ARGV: the group-config key without its group id (the key prefix up to it)
-- Returns {the registry flattened, the group ids sorted, their configurations in that order}.
local flat = redis.call('HGETALL', KEYS[1])
local seen, groups, configs = {}, {}, {}
for i = 2, #flat, 2 do
  if not seen[flat[i]] then seen[flat[i]] = true; groups[#groups + 1] = flat[i] end
end
table.sort(groups)
for i, group in ipairs(groups) do configs[i] = redis.call('GET', ARGV[1] .. group) end
return {flat, groups, configs}
