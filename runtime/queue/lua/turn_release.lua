-- TURN RELEASE: gives the group's turn back; a note left meanwhile becomes a wake token.
-- KEYS: turn key, again key, wake list
-- ARGV: holder id, "1" when work was left for others, token cap, token TTL ms
-- Returns 1 when someone found the turn taken meanwhile (it was woken again).
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
local again = redis.call('GETDEL', KEYS[2])
if again or ARGV[2] == '1' then
--! wake key=KEYS[3] cap=ARGV[3] ttl=ARGV[4]
end
if again then return 1 end
return 0
