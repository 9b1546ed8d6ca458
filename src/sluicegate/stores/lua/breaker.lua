-- One deployment's circuit, shared by the fleet: a replica hands over the outcomes it
-- saw since its last call and learns the circuit's state (FleetBreaker.sync_breaker).
-- KEYS: the circuit's hash.
-- ARGV: now, replica, ok, failed, trailing failures, probe result ('' | 'ok' | 'fail'),
--       consecutive_failures, failure_ratio, window, min_attempts, open_s, max_open_s.
-- Returns {state, seconds until it reopens, 1 when the replica holds the fleet's probe}.
-- The window is the last `window` outcomes, approximated by scaling both counts down
-- once more were seen; half open, only the probe's result counts.
local now = now_s()
local key, replica = KEYS[1], ARGV[2]
local ok, failed, trailing = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local probe = ARGV[6]
local consecutive, ratio = tonumber(ARGV[7]), tonumber(ARGV[8])
local window, min_attempts = tonumber(ARGV[9]), tonumber(ARGV[10])
local open_s, max_open_s = tonumber(ARGV[11]), tonumber(ARGV[12])

local h = redis.call('HMGET', key, 'state', 'until', 'open_for', 'run', 'oks', 'fails',
  'holder', 'held_until')
local state = h[1] or 'closed'
local reopen_at = tonumber(h[2] or '0')
local open_for = tonumber(h[3] or open_s)
local run, oks, fails = tonumber(h[4] or '0'), tonumber(h[5] or '0'), tonumber(h[6] or '0')
local holder, held_until = h[7] or '', tonumber(h[8] or '0')

local function open(seconds)
  state, reopen_at, open_for = 'open', now + seconds, seconds
  run, oks, fails, holder = 0, 0, 0, ''
end

if state == 'half_open' then
  if holder == replica and probe ~= '' then
    if probe == 'ok' then
      state, run, oks, fails, holder, open_for = 'closed', 0, 0, 0, '', open_s
    else
      open(math.min(max_open_s, 2 * open_for))
    end
  elseif holder ~= '' and held_until <= now then
    holder = ''
  end
elseif state == 'closed' then
  if ok > 0 then run = trailing else run = run + trailing end
  oks, fails = oks + ok, fails + failed
  local seen = oks + fails
  if seen > window then
    oks, fails, seen = oks * window / seen, fails * window / seen, window
  end
  if run >= consecutive or (seen >= min_attempts and fails / seen >= ratio) then
    open(open_s)
  end
end
if state == 'open' and now >= reopen_at then
  state, holder = 'half_open', ''
end
if state == 'half_open' and holder == '' then
  holder, held_until = replica, now + open_s
end

redis.call('HSET', key, 'state', state, 'until', exact('', reopen_at), 'open_for',
  exact('', open_for), 'run', run, 'oks', exact('', oks), 'fails', exact('', fails),
  'holder', holder, 'held_until', exact('', held_until))
keep_for(key, 2 * max_open_s + 60)
return {state, tostring(math.max(0, reopen_at - now)), holder == replica and 1 or 0}
