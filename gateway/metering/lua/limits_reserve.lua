-- Check and take 1 request, ARGV tokens and ARGV nano-USD of budget, all or nothing.
-- ARGV: 1 request id, 2 tokens, 3 nano-USD, 4 rpm, 5 tpm, 6 budget nano-USD (-1 = no limit),
--       7 budget period, 8 window ms, 9 sub-buckets per window, 10 lease ms
-- Returns {1, now, rpm used, tpm used, rpm reset ms, tpm reset ms, budget window}
--      or {0, reason, retry ms (-1 = never fits), now, rpm used, tpm used, rpm reset, tpm reset,
--          spent, held}
--      or {-1} when the request id already holds a reservation.
local rid = ARGV[1]
local tokens, nanos = tonumber(ARGV[2]), tonumber(ARGV[3])
local rpm, tpm, budget = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local period = ARGV[7]
local window_ms, buckets, lease_ms = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local bucket_ms = window_ms / buckets

if redis.call('HEXISTS', KEYS[3], rid) == 1 then
  return {-1}
end

local now = now_ms()
local cur = math.floor(now / bucket_ms)

-- Holds whose lease ran out belong to a gateway that died mid-request: give their budget back
-- but keep a marker for one more lease, so that a late settle still charges what was spent.
for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 8)) do
  local value = redis.call('HGET', KEYS[3], old)
  if value and string.sub(value, -2) ~= ' r' then
    local _, old_nanos, _, old_period, old_window = parse_hold(value)
    unhold_budget(old_period, old_window, old_nanos)
    redis.call('HSET', KEYS[3], old, value .. ' r')
    redis.call('ZADD', KEYS[4], now + lease_ms, old)
  else
    redis.call('HDEL', KEYS[3], old)
    redis.call('ZREM', KEYS[4], old)
  end
end

local rpm_used, rpm_newest, rpm_live = window_usage(KEYS[1], cur - buckets + 1)
local tpm_used, tpm_newest, tpm_live = window_usage(KEYS[2], cur - buckets + 1)

local budget_key, window, window_end, spent, held, rolled
if budget >= 0 then
  budget_key = KEYS[BUDGET_KEY[period]]
  window, window_end = budget_window(period, now)
  local stored_window
  stored_window, spent, held = budget_state(budget_key)
  rolled = stored_window ~= window
  if rolled then
    spent, held = 0, 0
  end
end

local function reset_ms(newest)
  if newest == nil then
    return 0
  end
  return (newest + buckets) * bucket_ms - now
end

-- ms until `need` units have slid out of the window (oldest sub-buckets leave first)
local function wait_for(live, need)
  table.sort(live, function(a, b) return a[1] < b[1] end)
  local freed = 0
  for _, entry in ipairs(live) do
    freed = freed + entry[2]
    if freed >= need then
      return (entry[1] + buckets) * bucket_ms - now
    end
  end
  return window_ms
end

-- Admission: budget - spent - held > 0 and estimate <= budget - spent - held. Written as
-- differences so that every intermediate stays an exact integer below 2^53.
local reason, retry
local room = budget_key and budget - spent - held
if budget_key and (room <= 0 or nanos > room) then
  reason = 'budget'
  if budget - spent > 0 and nanos <= budget - spent then
    retry = 1000 -- only holds of requests in flight are in the way; they settle soon
  else
    retry = window_end
    if window_end >= 0 then
      retry = window_end - now
    end
  end
elseif rpm >= 0 and rpm_used + 1 > rpm then
  reason = 'rpm'
  retry = rpm == 0 and -1 or wait_for(rpm_live, rpm_used + 1 - rpm)
elseif tpm >= 0 and tpm_used + tokens > tpm then
  reason = 'tpm'
  retry = tokens > tpm and -1 or wait_for(tpm_live, tpm_used + tokens - tpm)
end
if reason then
  return {0, reason, int(retry), int(now), int(rpm_used), int(tpm_used),
    int(reset_ms(rpm_newest)), int(reset_ms(tpm_newest)), int(spent or 0), int(held or 0)}
end

local ttl = int(window_ms + bucket_ms)
redis.call('HINCRBY', KEYS[1], int(cur), 1)
redis.call('PEXPIRE', KEYS[1], ttl)
if tokens > 0 then
  redis.call('HINCRBY', KEYS[2], int(cur), int(tokens))
  redis.call('PEXPIRE', KEYS[2], ttl)
  tpm_newest = cur
end
if budget_key then
  if rolled then
    redis.call('HSET', budget_key, 'window', window, 'spent', 0, 'reserved', int(nanos),
      'unit', 'nano')
  else
    redis.call('HINCRBY', budget_key, 'reserved', int(nanos))
  end
  if window_end >= 0 then
    -- a day past the window's end, so late settles still find it
    redis.call('PEXPIRE', budget_key, int(window_end - now + 86400000))
  end
end
redis.call('HSET', KEYS[3], rid,
  string.format('%d %d %d %s %s n', tokens, nanos, cur, budget_key and period or '-',
    window or '-'))
redis.call('ZADD', KEYS[4], int(now + lease_ms), rid)
redis.call('PEXPIRE', KEYS[3], int(2 * lease_ms + window_ms))
redis.call('PEXPIRE', KEYS[4], int(2 * lease_ms + window_ms))
return {1, int(now), int(rpm_used + 1), int(tpm_used + tokens), int(reset_ms(cur)),
  int(reset_ms(tpm_newest)), window or ''}
