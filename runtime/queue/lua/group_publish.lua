-- GROUP PUBLISH: a group's configuration stored and announced, its pools registered.
-- KEYS: config key, pool registry hash, config channel
-- ARGV: config JSON, group id, then the ids of the group's enabled pools
-- Returns how many pools were registered.
local registry = redis.call('HGETALL', KEYS[2])
for i = 1, #registry, 2 do
  if registry[i + 1] == ARGV[2] then redis.call('HDEL', KEYS[2], registry[i]) end
end
for i = 3, #ARGV do redis.call('HSET', KEYS[2], ARGV[i], ARGV[2]) end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('PUBLISH', KEYS[3], ARGV[1])
return #ARGV - 2
