-- SCRAPE RELEASE: gives the scraper lease up only if still ours (a stopping scraper).
-- KEYS: lease key
-- ARGV: owner id
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
