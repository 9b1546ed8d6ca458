-- Give back `amount` units of a rate (negative: charge more); idle time is not banked.
-- KEYS: the rate's key. ARGV: now, emission interval, amount.
local now = now_s()
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
tat = math.max(tat - tonumber(ARGV[2]) * tonumber(ARGV[3]), now)
redis.call('SET', KEYS[1], exact('', tat), 'PX', math.ceil((tat - now) * 1000) + 1000)
return nil
