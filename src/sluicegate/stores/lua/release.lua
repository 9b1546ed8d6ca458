-- Free a lease's slots (LimitStore.release); an id no longer there is no error.
-- KEYS: the lease's slot sets. ARGV: now (unused), the lease id.
for i = 1, #KEYS do
  redis.call('ZREM', KEYS[i], ARGV[2])
end
return nil
