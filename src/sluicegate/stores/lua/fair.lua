-- One lane's fair shares, held for the fleet: a replica hands over the service it
-- charged since its last call and which flows wait on it, and learns every waiting
-- flow's counter (scheduling.fleet_fairness).
-- KEYS: the counters' hash, the backlog's sorted set (members "flow|replica", scored by
--       expiry).
-- ARGV: now, replica, ttl_s, #charges, (flow, amount)..., #waiting, flow..., #idle, flow...
-- Returns {flow, counter, ...} for every flow waiting anywhere. A flow that starts waiting
-- when no replica had it waiting is lifted to the least counter of those waiting, so
-- time spent idle is not banked (the VTC lift rule, over the whole fleet).
local now = now_s()
local counters, backlog = KEYS[1], KEYS[2]
local replica, ttl = ARGV[2], tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', backlog, '-inf', now)

local waiting = {}
for _, member in ipairs(redis.call('ZRANGE', backlog, 0, -1)) do
  waiting[string.match(member, '^(.*)|[^|]*$')] = true
end

local at = 4
local charges = tonumber(ARGV[at])
for i = 1, charges do
  redis.call('HINCRBYFLOAT', counters, ARGV[at + 2 * i - 1], ARGV[at + 2 * i])
end
at = at + 2 * charges + 1

local function least()
  local low = nil
  for flow in pairs(waiting) do
    local value = tonumber(redis.call('HGET', counters, flow) or '0')
    if low == nil or value < low then low = value end
  end
  return low
end

local count = tonumber(ARGV[at])
for i = 1, count do
  local flow = ARGV[at + i]
  if not waiting[flow] then
    local low = least()
    local own = tonumber(redis.call('HGET', counters, flow) or '0')
    if low ~= nil and low > own then
      redis.call('HSET', counters, flow, exact('', low))
    end
    waiting[flow] = true
  end
  redis.call('ZADD', backlog, now + ttl, flow .. '|' .. replica)
end
at = at + count + 1

for i = 1, tonumber(ARGV[at]) do
  redis.call('ZREM', backlog, ARGV[at + i] .. '|' .. replica)
end

local answer = {}
for _, member in ipairs(redis.call('ZRANGE', backlog, 0, -1)) do
  local flow = string.match(member, '^(.*)|[^|]*$')
  if waiting[flow] ~= 'listed' then
    waiting[flow] = 'listed'
    answer[#answer + 1] = flow
    answer[#answer + 1] = redis.call('HGET', counters, flow) or '0'
  end
end
keep_for(counters, 3600)
keep_for(backlog, ttl)
return answer
