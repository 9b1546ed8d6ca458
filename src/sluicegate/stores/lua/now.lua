-- The decision's time: the server's clock, so that replicas with skewed clocks agree;
-- a test may pass its own (ARGV[1] not empty).
local function now_s()
  if ARGV[1] ~= '' then
    return tonumber(ARGV[1])
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- Expire `key` no earlier than `seconds` from now (never shortens a longer expiry).
local function keep_for(key, seconds)
  local ms = math.ceil(seconds * 1000) + 1000
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- A time written or compared as text keeps every digit (tostring keeps 14).
local function exact(prefix, seconds)
  return prefix .. string.format('%.17g', seconds)
end

-- Set a freed slot aside for the replica first in its line (keys.slot_line), if any,
-- for `claim_s`, taking it out of the line.
local function hand_on(line, owed, now, claim_s)
  local first = redis.call('ZPOPMIN', line)
  if first[1] then
    redis.call('HSET', owed, first[1], exact('', now + claim_s))
    keep_for(owed, claim_s)
  end
end

-- The prompts a prefill budget counts (keys.prefill: tokens by lease id, when each
-- lapses, when those sent on what their promise had left are due), after dropping
-- those lapsed and the due times passed: how many, their tokens, and the earliest due
-- time still to come (nil when none is).
local function prefill_pending(sent, lapse, due, now)
  local lapsed = redis.call('ZRANGEBYSCORE', lapse, '-inf', exact('', now))
  if #lapsed > 0 then
    redis.call('HDEL', sent, unpack(lapsed))
    redis.call('ZREM', due, unpack(lapsed))
    redis.call('ZREMRANGEBYSCORE', lapse, '-inf', exact('', now))
  end
  redis.call('ZREMRANGEBYSCORE', due, '-inf', exact('', now))
  local count, pending = 0, 0
  for _, tokens in ipairs(redis.call('HVALS', sent)) do
    count, pending = count + 1, pending + tonumber(tokens)
  end
  local earliest = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')[2]
  return count, pending, earliest and tonumber(earliest)
end
