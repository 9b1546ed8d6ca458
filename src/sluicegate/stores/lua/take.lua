-- One decision, all or nothing (LimitStore.take).
-- KEYS: the cooldowns, then the slots, then the charges of the ask.
-- ARGV: now, lease id, ttl_s, #cooldowns, #slots, the slots' limits, then per charge:
--       emission interval, tolerance, cost, burst.
-- Returns nil when granted (the lease id added to every slot's set, scored by its
-- expiry), else {part, index from 0, seconds until it may pass or ''}; a refusal
-- writes nothing.
local now = now_s()
local id, ttl = ARGV[2], tonumber(ARGV[3])
local ncool, nslot = tonumber(ARGV[4]), tonumber(ARGV[5])
local first_charge = ncool + nslot

for i = 1, ncool do
  local cool_until = tonumber(redis.call('GET', KEYS[i]) or '0')
  if cool_until > now then
    return {'cooldown', i - 1, tostring(cool_until - now)}
  end
end

for i = 1, nslot do
  local limit = tonumber(ARGV[5 + i])
  if redis.call('ZCOUNT', KEYS[ncool + i], exact('(', now), '+inf') >= limit then
    return {'slot', i - 1, ''}
  end
end

local tats, order = {}, {}
local at = 5 + nslot
for i = 1, #KEYS - first_charge do
  local key = KEYS[first_charge + i]
  local interval, tolerance = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local cost, burst = tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
  at = at + 4
  if cost > burst then
    return {'charge', i - 1, 'inf'}
  end
  local tat = tats[key]
  if tat == nil then
    tat = tonumber(redis.call('GET', key) or now)
    order[#order + 1] = key
  end
  local new_tat = math.max(tat, now) + interval * cost
  local wait = new_tat - tolerance - now
  if wait > 0 then
    return {'charge', i - 1, tostring(wait)}
  end
  tats[key] = new_tat
end

for _, key in ipairs(order) do
  local tat = tats[key]
  redis.call('SET', key, exact('', tat), 'PX', math.ceil((tat - now) * 1000) + 1000)
end
for i = 1, nslot do
  local key = KEYS[ncool + i]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  redis.call('ZADD', key, now + ttl, id)
  keep_for(key, ttl)
end
return nil
