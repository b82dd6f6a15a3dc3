-- BURY_LETTER: BURY's last steps, shared with TENANT_BURY: the dead letter stored, its producer told if
-- it is alive. KEYS and ARGV as BURY declares them.
redis.call('RPUSH', KEYS[2], ARGV[2])
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('RPUSH', KEYS[4], ARGV[3])
  redis.call('PEXPIRE', KEYS[4], ARGV[4])
end
