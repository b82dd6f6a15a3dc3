"""One scheduling round at a time per fabric group: the fleet decides as one scheduler would.

Dispatchers that run rounds at the same moment peek the same heads and race to claim them; the
losers refund their credit and run again (about one lost claim per completion with three
dispatchers). A short turn lease serialises the *decisions* only -- a round is two round trips --
while calls run in every process in parallel. The lease is taken in the observe pipeline and given
back in the claim pipeline, so it costs no round trip of its own.

Each round also reads the fleet (dispatchers that ran a round lately, with their local slots), so
that a dispatcher keeps to its share of the group's slots (:func:`runtime.policy.scheduler.fleet_share`,
even for equal dispatchers): otherwise the one whose calls just finished takes every freed slot, and
three dispatchers split work 7/47/46 %.

A dispatcher that finds the turn taken leaves a note (``again``); when the holder gives the turn back,
the note becomes a wake token, so whatever woke the other one gets a round. A holder cut short by its
own free slots wakes an idle dispatcher for the rest the same way. Correctness never depends on the turn (the
claim script checks everything atomically); a holder that dies only delays others by the lease.
"""

from __future__ import annotations

from runtime.dispatch.wakeup import wake_lua

# Longer than a round, even on a busy machine; a dead holder delays the others this long at most.
TURN_LEASE_MS = 200

# A dispatcher counts as part of the fleet this long after its last round.
FLEET_MEMBER_S = 3.0

# KEYS: turn key, again key, fleet zset; ARGV: holder id, lease ms, fleet membership seconds, fleet
# member ("<holder id> <local slots>"). Returns {1 when the turn is ours, the fleet's members: the
# dispatchers of the group seen within FLEET_MEMBER_S}.
ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local fleet = redis.call('ZRANGE', KEYS[3], 0, -1)
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, fleet} end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return {0, fleet}
"""

# KEYS: turn key, again key, wake list; ARGV: holder id, "1" when work was left for others, token
# cap, token TTL ms. Returns 1 when someone found the turn taken meanwhile (it was woken again).
RELEASE = (
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
local again = redis.call('GETDEL', KEYS[2])
if again or ARGV[2] == '1' then
"""
    + wake_lua("KEYS[3]", "ARGV[3]", "ARGV[4]")
    + """
end
if again then return 1 end
return 0
"""
)
