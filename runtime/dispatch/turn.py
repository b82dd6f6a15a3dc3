"""One scheduling round at a time per fabric group: the fleet decides as one scheduler would.

Dispatchers that run rounds at the same moment peek the same heads and race to claim them; the
losers refund their credit and run again (about one lost claim per completion with three
dispatchers). A short turn lease serialises the *decisions* only -- a round is two round trips --
while calls run in every process in parallel. The lease is taken in the observe pipeline and given
back in the claim pipeline, so it costs no round trip of its own.

A dispatcher that finds the turn taken leaves a note (``again``); the holder reads it when it gives
the turn back and runs one more round, which sees whatever woke the other one. A holder cut short by
its own free slots wakes an idle dispatcher for the rest. Correctness never depends on the turn (the
claim script checks everything atomically); a holder that dies only delays others by the lease.
"""

from __future__ import annotations

from runtime.dispatch.wakeup import wake_lua

# Longer than a round, even on a busy machine; a dead holder delays the others this long at most.
TURN_LEASE_MS = 200

# KEYS: turn key, again key; ARGV: holder id, lease ms. Returns 1 when the turn is ours.
ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return 0
"""

# KEYS: turn key, again key, wake list; ARGV: holder id, "1" when work was left for others, token
# cap, token TTL ms. Returns 1 when someone found the turn taken meanwhile: run one more round.
RELEASE = (
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
local again = redis.call('GETDEL', KEYS[2])
if ARGV[2] == '1' then
"""
    + wake_lua("KEYS[3]", "ARGV[3]", "ARGV[4]")
    + """
end
if again then return 1 end
return 0
"""
)
