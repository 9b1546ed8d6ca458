-- One lane's fair shares, held for the fleet: a replica hands over the service it
-- charged since its last call, which flows wait on it and how many requests each flow
-- holds there (in flight or queued), and learns every waiting flow's counter and every
-- flow's requests held on the other replicas (scheduling.fleet_fairness).
-- KEYS: the counters' hash, the backlog's sorted set (members "flow|replica", scored by
--       expiry), the held requests' sorted set (the same members and scores; its key
--       still says "flying", from when it counted requests in flight only) and their
--       counts' hash (fields "flow|replica").
-- ARGV: now, replica, ttl_s, #charges, (flow, amount)..., #waiting, flow..., #idle, flow...,
--       #held, (flow, count)...
-- Returns {{flow, counter, ...} for every flow waiting anywhere, {flow, count, ...} of
-- the other replicas' requests held}. A flow that starts waiting when no replica
-- had it waiting is lifted to the least counter of those waiting, so time spent idle is
-- not banked (the VTC lift rule, over the whole fleet).
local now = now_s()
local counters, backlog = KEYS[1], KEYS[2]
local flying, flying_counts = KEYS[3], KEYS[4]
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
at = at + tonumber(ARGV[at]) + 1

local suffix = '|' .. replica
local function forget(member)
  redis.call('ZREM', flying, member)
  redis.call('HDEL', flying_counts, member)
end
for _, member in ipairs(redis.call('ZRANGEBYSCORE', flying, '-inf', now)) do
  forget(member)
end
-- One pass over the live entries: this replica's are replaced below, the others' summed.
local elsewhere = {}
for _, member in ipairs(redis.call('ZRANGE', flying, 0, -1)) do
  if string.sub(member, -#suffix) == suffix then
    forget(member)
  else
    local flow = string.match(member, '^(.*)|[^|]*$')
    local count = tonumber(redis.call('HGET', flying_counts, member) or '0')
    elsewhere[flow] = (elsewhere[flow] or 0) + count
  end
end
for i = 1, tonumber(ARGV[at]) do
  local member = ARGV[at + 2 * i - 1] .. suffix
  redis.call('ZADD', flying, now + ttl, member)
  redis.call('HSET', flying_counts, member, ARGV[at + 2 * i])
end
local held = {}
for flow, count in pairs(elsewhere) do
  held[#held + 1] = flow
  held[#held + 1] = tostring(count)
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
keep_for(flying, ttl)
keep_for(flying_counts, ttl)
return {answer, held}
