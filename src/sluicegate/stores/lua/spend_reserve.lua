-- Reserve a request's estimated cost on each of its budgets, or on none (BudgetStore).
-- KEYS: the build marker, then one counter per budget line.
-- ARGV: nanodollars, then per line: its limit, when its counter may expire (unix s).
-- Returns {-2} while the counters are unbuilt (lost, not yet rebuilt), else {index of
-- the first line without room or -1, the build's epoch, each counter after}.
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  return {-2}
end
local nanos = tonumber(ARGV[1])
local totals, refused = {}, -1
for i = 2, #KEYS do
  local total = tonumber(redis.call('GET', KEYS[i]) or '0')
  totals[i - 1] = total
  if refused < 0 and total + nanos > tonumber(ARGV[2 * i - 2]) then
    refused = i - 2
  end
end
if refused < 0 then
  for i = 2, #KEYS do
    totals[i - 1] = redis.call('INCRBY', KEYS[i], nanos)
    redis.call('EXPIREAT', KEYS[i], ARGV[2 * i - 1])
  end
end
return {refused, epoch, unpack(totals)}
