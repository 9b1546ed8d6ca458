-- A replica says it is alive and learns how many are (lapsed ones are dropped).
-- KEYS: the replicas' set. ARGV: now, this replica's id, ttl_s.
local now = now_s()
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
keep_for(KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
