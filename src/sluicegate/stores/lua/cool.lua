-- Refuse a key for `duration_s` from now; extends, never shortens, a cooldown.
-- KEYS: the cooldown's key. ARGV: now, duration_s.
local now = now_s()
local duration = tonumber(ARGV[2])
local cool_until = now + duration
if cool_until > tonumber(redis.call('GET', KEYS[1]) or '0') then
  redis.call('SET', KEYS[1], exact('', cool_until), 'PX', math.ceil(duration * 1000) + 1000)
end
return nil
