-- DEAD LETTER TAKE: an operator's replay or discard of one exact stored letter.
-- KEYS: dead-letter list, requests list
-- ARGV: stored dead letter bytes, envelope to queue ('' = discard)
-- Returns 1 when the letter was there (and was replayed or discarded), 0 when someone else took it.
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
if ARGV[2] ~= '' then redis.call('RPUSH', KEYS[2], ARGV[2]) end
return 1
