-- Fragment (included as `--! wake_head key=... cap=... ttl=... head=...`): the wake token of a push
-- that made its pool's list non-empty: the request $head itself when small enough, so the dispatcher
-- it wakes can claim it at once (runtime.dispatch.wakeup), else "1"; at most $cap tokens, the list
-- lapsing after $ttl ms.
if redis.call('LLEN', $key) < tonumber($cap) then
  if #$head <= $WAKE_HEAD_MAX_BYTES then
    redis.call('RPUSH', $key, $head)
  else
    redis.call('RPUSH', $key, '1')
  end
  redis.call('PEXPIRE', $key, $ttl)
end
