-- Count what a request spent in place of what it reserved (BudgetStore.settle).
-- KEYS: the build marker, then one counter per budget line.
-- ARGV: reserved, spent (nanodollars), the epoch it reserved in, then per line when its
-- counter may expire. A reservation made in another build was lost with its counters:
-- the whole spend is added. Returns {-2} while unbuilt, else {0, each counter after}.
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  return {-2}
end
local delta = tonumber(ARGV[2])
if ARGV[3] == epoch then
  delta = delta - tonumber(ARGV[1])
end
local totals = {}
for i = 2, #KEYS do
  totals[i - 1] = redis.call('INCRBY', KEYS[i], delta)
  redis.call('EXPIREAT', KEYS[i], ARGV[i + 2])
end
return {0, unpack(totals)}
