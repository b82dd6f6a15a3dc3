-- SPANS TRIM ACKED: trims everything the group has acknowledged: up to the oldest pending entry, or
-- past the last delivered.
-- KEYS: span stream
-- ARGV: consumer group name
-- Returns how many entries were trimmed.
local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[1])
if not ok then return 0 end
local last = nil
for _, g in ipairs(groups) do
  local name, lastid = nil, nil
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] end
    if g[i] == 'last-delivered-id' then lastid = g[i + 1] end
  end
  if name == ARGV[1] then last = lastid end
end
if not last then return 0 end
local pending = redis.call('XPENDING', KEYS[1], ARGV[1])
local minid
if tonumber(pending[1]) > 0 then
  minid = pending[2]
else
  local ms, seq = string.match(last, '(%d+)-(%d+)')
  minid = ms .. '-' .. tostring(tonumber(seq) + 1)
end
return redis.call('XTRIM', KEYS[1], 'MINID', minid)
