-- Look up one entry and count the outcome in its scope, in one round trip.
-- KEYS: entry, meta. ARGV: magic, max_age_ms (-1: any), now_ms, keep_ms, namespace, model.
-- Returns {entry or nil, epoch, registered}: registered = 1 when the scope is new.
local value = redis.call('GET', KEYS[1])
local outcome = 'miss'
if value and string.sub(value, 1, 4) == ARGV[1] then
  local max_age = tonumber(ARGV[2])
  if max_age < 0 or tonumber(ARGV[3]) - tonumber(string.sub(value, 5, 17)) <= max_age then
    outcome = 'hit'
  end
end
if outcome == 'miss' then
  value = false
end
redis.call('HINCRBY', KEYS[2], outcome, 1)
local registered = touch_meta(KEYS[2], tonumber(ARGV[4]), ARGV[5], ARGV[6])
local epoch = redis.call('HGET', KEYS[2], 'epoch') or '0'
return {value, epoch, registered}
