-- GROUP UNPUBLISH: a group's configuration and its pools' registrations removed, and announced.
-- KEYS: config key, pool registry hash, config channel
-- ARGV: group id
local registry = redis.call('HGETALL', KEYS[2])
for i = 1, #registry, 2 do
  if registry[i + 1] == ARGV[1] then redis.call('HDEL', KEYS[2], registry[i]) end
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[3], '')
return 1
