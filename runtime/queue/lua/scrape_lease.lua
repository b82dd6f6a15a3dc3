-- SCRAPE LEASE: takes or renews a backend's scraper lease.
-- KEYS: lease key
-- ARGV: owner id, lease ms
-- Returns 1 when the caller holds the lease (taken or renewed).
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if owner then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
