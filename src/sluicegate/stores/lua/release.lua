-- Free a lease's slots (LimitStore.release); an id no longer there is no error.
-- KEYS: the lease's slot sets, those to announce first. ARGV: now (unused), the lease
-- id, the release channel, how many of KEYS to announce. Each announced slot freed is
-- published, so replicas with work waiting for that slot look again at once instead of
-- at their next timer.
local announced = tonumber(ARGV[4])
for i = 1, #KEYS do
  if redis.call('ZREM', KEYS[i], ARGV[2]) == 1 and i <= announced then
    redis.call('PUBLISH', ARGV[3], KEYS[i])
  end
end
return nil
