-- One decision, all or nothing (LimitStore.take).
-- KEYS: the cooldowns, then the slots, then the charges of the ask, then a line and its
--       set-asides (keys.slot_line) per lined slot, in the slots' order, then the prefill
--       budget's keys (keys.prefill) when it has one.
-- ARGV: now, lease id, ttl_s, #cooldowns, #slots, 1 when the asker is queued for these
--       slots (else 0), the release channel, how long a set-aside waits for its replica,
--       1 when the ask has a prefill part (else 0), then per slot: its limit and 1 when
--       it is lined (else 0), then per charge: emission interval, tolerance, cost,
--       burst, then the prefill part's: prompt tokens, within_s, growth, how long a
--       learnt rate is kept unused, 1 when the prompt is due within_s from now (else 0).
-- Returns nil when granted (the lease id added to every slot's set, scored by its
-- expiry), else {part, index from 0, seconds until it may pass or ''}; the prefill
-- part gives the time until the earliest due time passes, if one is to come.
-- A lined slot is one replicas queue for. Its slots set aside for other replicas (by
-- give_back, for the head of the line) count as held; a queued replica refused one joins
-- the line (keeping its place if in it); any refused only by set-asides is told when the
-- first lapses. A grant takes the replica out of the line and uses its set-aside; a
-- queued replica refused at a slot set aside for it (its ask leaves more free: work
-- beyond its share must leave the reserve) hands it on to the next in line and
-- announces it again, rather than let it idle until it lapses; refused by anything else
-- first (a cooldown, another slot, a rate, the prefill budget) it keeps it until then.
-- The prefill part (core/prefill.py) admits a prompt when none is counted, else when
-- the counted ones and it fit what the learnt rate prefills within `within_s` (and
-- before the earliest due time still to come) and `growth` times the most seen
-- prefilled together; granted, it is counted (and, if due, its due time kept) under the
-- lease id until prefilled.lua ends it or it lapses unrenewed after the ttl (renew.lua
-- extends it with its lease; the budget's keys themselves are kept as long as what was
-- learnt), and the busy period starts if none was counted. A prefill refusal marks the
-- budget as waited for, so that the next prompt's end is announced. Apart from that, a
-- refusal writes only the removal of lapsed set-asides, lapsed prompts and due times
-- passed.
local now = now_s()
local id, ttl = ARGV[2], tonumber(ARGV[3])
local ncool, nslot = tonumber(ARGV[4]), tonumber(ARGV[5])
local queued, channel, claim_s = ARGV[6] == '1', ARGV[7], tonumber(ARGV[8])
local prefilling = ARGV[9] == '1'
local first_charge = ncool + nslot
local nlined = 0
for i = 1, nslot do
  nlined = nlined + tonumber(ARGV[9 + 2 * i])
end
local before_prefill = #KEYS
if prefilling then
  before_prefill = #KEYS - 4
end
local first_line = before_prefill - 2 * nlined
local who = string.match(id, '^(.*):') or id

for i = 1, ncool do
  local cool_until = tonumber(redis.call('GET', KEYS[i]) or '0')
  if cool_until > now then
    return {'cooldown', i - 1, tostring(cool_until - now)}
  end
end

local lines = {}
for i = 1, nslot do
  local key = KEYS[ncool + i]
  local limit = tonumber(ARGV[8 + 2 * i])
  local held = redis.call('ZCOUNT', key, exact('(', now), '+inf')
  if ARGV[9 + 2 * i] == '1' then
    local line = KEYS[first_line + 2 * #lines + 1]
    local owed = KEYS[first_line + 2 * #lines + 2]
    local aside, lapse, mine = 0, nil, false
    local entries = redis.call('HGETALL', owed)
    for j = 1, #entries, 2 do
      local until_s = tonumber(entries[j + 1])
      if until_s <= now then
        redis.call('HDEL', owed, entries[j])
      elseif entries[j] ~= who then
        aside = aside + 1
        lapse = math.min(lapse or until_s, until_s)
      else
        mine = true
      end
    end
    if held + aside >= limit then
      if queued then
        if mine then
          redis.call('HDEL', owed, who)
          hand_on(line, owed, now, claim_s)
          redis.call('PUBLISH', channel, key)
        end
        redis.call('ZADD', line, 'NX', exact('', now), who)
        keep_for(line, ttl)
      end
      local wait = ''
      if held < limit and lapse then
        wait = tostring(lapse - now)
      end
      return {'slot', i - 1, wait}
    end
    lines[#lines + 1] = {line, owed}
  elseif held >= limit then
    return {'slot', i - 1, ''}
  end
end

local tats, order = {}, {}
local at = 9 + 2 * nslot
for i = 1, first_line - first_charge do
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

local sent, lapse, learnt, due, tokens, within, counted
if prefilling then
  sent, lapse, learnt, due = KEYS[#KEYS - 3], KEYS[#KEYS - 2], KEYS[#KEYS - 1], KEYS[#KEYS]
  tokens, within = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local pending, earliest
  counted, pending, earliest = prefill_pending(sent, lapse, due, now)
  if counted > 0 then
    local state = redis.call('HMGET', learnt, 'tokens', 'busy', 'proven')
    local done, busy = tonumber(state[1] or '0'), tonumber(state[2] or '0')
    local fits = false
    if done > 0 and busy > 0 then
      local limit = math.min(done / busy * math.min(within, (earliest or math.huge) - now),
        tonumber(ARGV[at + 3]) * tonumber(state[3] or '0'))
      fits = pending + tokens <= limit
    end
    if not fits then
      redis.call('HSETNX', learnt, 'waited', '1')
      keep_for(learnt, tonumber(ARGV[at + 4]))
      return {'prefill', 0, earliest and exact('', earliest - now) or ''}
    end
  end
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
for _, pair in ipairs(lines) do
  redis.call('ZREM', pair[1], who)
  redis.call('HDEL', pair[2], who)
end
if prefilling then
  if counted == 0 then
    redis.call('HSET', learnt, 'since', exact('', now))
    keep_for(learnt, tonumber(ARGV[at + 4]))
  end
  redis.call('HSET', sent, id, tokens)
  redis.call('ZADD', lapse, exact('', now + ttl), id)
  keep_for(sent, tonumber(ARGV[at + 4]))
  keep_for(lapse, tonumber(ARGV[at + 4]))
  if ARGV[at + 5] == '1' then
    redis.call('ZADD', due, exact('', now + within), id)
    keep_for(due, tonumber(ARGV[at + 4]))
  end
end
return nil
