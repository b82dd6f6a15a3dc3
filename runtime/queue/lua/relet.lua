-- RELET: gives a lease back to the dispatcher still running its call, with its record, after a REAP
-- took it (lists mode only: a durable lease REAP took went back to its list, and its fencing token is
-- gone). A starved dispatcher (a loaded machine, a frozen Valkey) can miss its renewals and reap its
-- own leases: without the lease its call counts in no cap, and without the record nobody would count
-- the call lost if the dispatcher died before it finished. NX: a lease renewed meanwhile is kept.
-- KEYS: group lease zset, pool lease zset, backend lease zset, lease records hash
-- ARGV: expiry offset seconds, member, record
local t = redis.call('TIME')
local expiry = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[1])
redis.call('ZADD', KEYS[1], 'NX', expiry, ARGV[2])
redis.call('ZADD', KEYS[2], 'NX', expiry, ARGV[2])
redis.call('ZADD', KEYS[3], 'NX', expiry, ARGV[2])
redis.call('HSETNX', KEYS[4], ARGV[2], ARGV[3])
return 1
