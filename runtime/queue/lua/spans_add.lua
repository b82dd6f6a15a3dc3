-- SPANS ADD: XADD every span, then cap the stream; what the cap deletes was never ingested, and is
-- counted.
-- KEYS: span stream, trimmed-spans counter
-- ARGV: the spans, then the stream's MAXLEN
-- Returns how many entries the cap deleted.
for i = 1, #ARGV - 1 do
  redis.call('XADD', KEYS[1], '*', 'span', ARGV[i])
end
local deleted = redis.call('XTRIM', KEYS[1], 'MAXLEN', '~', ARGV[#ARGV])
if deleted > 0 then
  redis.call('INCRBY', KEYS[2], deleted)
end
return deleted
