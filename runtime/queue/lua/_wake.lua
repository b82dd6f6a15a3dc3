-- Fragment (included as `--! wake key=... cap=... ttl=...`): add a token to the wake list $key
-- unless it already holds $cap tokens; the list lapses after $ttl ms.
if redis.call('LLEN', $key) < tonumber($cap) then
  redis.call('RPUSH', $key, '1')
  redis.call('PEXPIRE', $key, $ttl)
end
