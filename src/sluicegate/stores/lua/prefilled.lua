-- Prompts' ends in their prefill budgets (LimitStore.prefilled), in order: each counted
-- prompt stops counting; one that got its first token teaches the budget as
-- core/prefill.py does (tokens and busy time summed, older ones fading by e per
-- `horizon` of busy time; the most counted together when one arrived). A budget whose
-- prompts a decision refused since the last end is announced (its sent key), so that
-- replicas with work waiting for it look again at once.
-- KEYS: per end, its budget's keys (keys.prefill).
-- ARGV: now, the release channel, how long a learnt rate is kept unused, horizon, then
--       per end: the lease id, 1 when it got its first token (else 0).
-- Returns per end: its budget's pending tokens, learnt tokens and busy time, after it.
local now = now_s()
local channel, keep_s, horizon = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local states = {}
for e = 1, #KEYS / 4 do
  local sent, lapse, learnt, due = KEYS[4 * e - 3], KEYS[4 * e - 2], KEYS[4 * e - 1], KEYS[4 * e]
  local id, first = ARGV[3 + 2 * e], ARGV[4 + 2 * e] == '1'
  local _, pending = prefill_pending(sent, lapse, due, now)
  local tokens = tonumber(redis.call('HGET', sent, id) or '-1')
  if tokens >= 0 then
    redis.call('HDEL', sent, id)
    redis.call('ZREM', lapse, id)
    redis.call('ZREM', due, id)
    local state = redis.call('HMGET', learnt, 'tokens', 'busy', 'since', 'proven', 'waited')
    if first then
      local done, busy = tonumber(state[1] or '0'), tonumber(state[2] or '0')
      local since = tonumber(state[3] or now)
      local busy_s = now - since
      if busy_s > 0 then
        local fade = math.exp(-busy_s / horizon)
        done, busy, since = done * fade, fade * busy + busy_s, now
      end
      local proven = math.max(tonumber(state[4] or '0'), pending)
      redis.call('HSET', learnt, 'tokens', exact('', done + tokens), 'busy', exact('', busy),
        'since', exact('', since), 'proven', proven)
      keep_for(learnt, keep_s)
    end
    pending = pending - tokens
    if state[5] then
      redis.call('HDEL', learnt, 'waited')
      redis.call('PUBLISH', channel, sent)
    end
  end
  local learnt_now = redis.call('HMGET', learnt, 'tokens', 'busy')
  states[e] = {tostring(pending), learnt_now[1] or '0', learnt_now[2] or '0'}
end
return states
