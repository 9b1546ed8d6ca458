-- Extend leases still held (LimitStore.renew), or adopt leases held elsewhere.
-- KEYS: slot sets. ARGV: now, ttl_s, adopt ('1': add an id that is missing, for leases
-- granted while this store was unreachable), then per key: the number of ids, the ids.
-- A lapsed lease stays lapsed unless adopted.
local now = now_s()
local ttl, adopt = tonumber(ARGV[2]), ARGV[3] == '1'
local at = 3
for i = 1, #KEYS do
  local key = KEYS[i]
  local count = tonumber(ARGV[at + 1])
  for j = 1, count do
    local id = ARGV[at + 1 + j]
    local expiry = tonumber(redis.call('ZSCORE', key, id) or '0')
    if adopt or expiry > now then
      redis.call('ZADD', key, now + ttl, id)
    end
  end
  at = at + 1 + count
  keep_for(key, ttl)
end
return nil
