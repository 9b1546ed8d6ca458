-- What decisions hand back when they end (LimitStore.give_back): each lease's slots are
-- freed and, when that freed it (it was still held), its refunds applied; a lease that
-- holds no slot always applies them. An id no longer there, or lapsed, is no error and
-- refunds nothing, so giving back twice changes nothing.
-- KEYS: per give-back, its slot sets (those to announce first), a line and its
--       set-asides (keys.slot_line) per slot to announce, then its refunds' rates.
-- ARGV: now, the release channel, how long a set-aside waits for its replica, then per
--       give-back: the lease id, #slots, how many of them to announce, #refunds, then
--       per refund: emission interval, amount (negative: charge more).
-- Each announced slot freed is set aside for the replica first in its line, if any, and
-- published, so replicas with work waiting for that slot look again at once instead of
-- at their next timer: the first in line takes it, whoever freed it. Idle time is not
-- banked.
local now = now_s()
local channel, claim_s = ARGV[2], tonumber(ARGV[3])
local k, at = 0, 4
while at <= #ARGV do
  local id = ARGV[at]
  local slots, announced = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local refunds = tonumber(ARGV[at + 3])
  at = at + 4
  local freed = slots == 0
  for i = 1, slots do
    local key = KEYS[k + i]
    local expiry = redis.call('ZSCORE', key, id)
    if expiry then
      redis.call('ZREM', key, id)
      if tonumber(expiry) > now then
        freed = true
        if i <= announced then
          hand_on(KEYS[k + slots + 2 * i - 1], KEYS[k + slots + 2 * i], now, claim_s)
          redis.call('PUBLISH', channel, key)
        end
      end
    end
  end
  k = k + slots + 2 * announced
  for i = 1, refunds do
    if freed then
      local key = KEYS[k + i]
      local tat = tonumber(redis.call('GET', key) or now)
      tat = math.max(tat - tonumber(ARGV[at]) * tonumber(ARGV[at + 1]), now)
      redis.call('SET', key, exact('', tat), 'PX', math.ceil((tat - now) * 1000) + 1000)
    end
    at = at + 2
  end
  k = k + refunds
end
return nil
