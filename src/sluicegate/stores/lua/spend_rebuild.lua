-- Set the budget counters from the durable record, once per loss (BudgetStore.rebuild).
-- KEYS: the build marker, then one counter per budget line.
-- ARGV: the new build's epoch, then per line: its spend, when it may expire (unix s).
-- Returns 0 when they were built already (another replica did it), 1 when built here.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
for i = 2, #KEYS do
  redis.call('SET', KEYS[i], ARGV[2 * i - 2])
  redis.call('EXPIREAT', KEYS[i], ARGV[2 * i - 1])
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
