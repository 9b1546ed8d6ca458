-- Units of a rate that could be charged now. KEYS: the rate's key.
-- ARGV: now, emission interval, tolerance, burst.
local now = now_s()
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
local interval, tolerance = tonumber(ARGV[2]), tonumber(ARGV[3])
local units = (tolerance - math.max(tat - now, 0)) / interval
return tostring(math.min(tonumber(ARGV[4]), units))
