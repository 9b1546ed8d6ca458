-- Leases held under a slot key now. KEYS: the slot set. ARGV: now.
return redis.call('ZCOUNT', KEYS[1], exact('(', now_s()), '+inf')
