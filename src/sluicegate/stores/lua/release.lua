-- Free a lease's slots (LimitStore.release); an id no longer there is no error.
-- KEYS: the lease's slot sets. ARGV: now (unused), the lease id, the release channel.
-- Each slot freed is announced on the channel, so replicas with work waiting for that
-- slot look again at once instead of at their next timer.
for i = 1, #KEYS do
  if redis.call('ZREM', KEYS[i], ARGV[2]) == 1 then
    redis.call('PUBLISH', ARGV[3], KEYS[i])
  end
end
return nil
