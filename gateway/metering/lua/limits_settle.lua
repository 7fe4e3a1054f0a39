-- Settle (ARGV 2 = 'settle') or release (= 'release') one reservation, exactly once, in every
-- scope it was taken in (KEYS: the key's scope, then its team's).
-- For a key of a team KEYS end with the team record (its budgets and alert thresholds).
-- ARGV: 1 request id, 2 mode, 3 tokens used, 4 nano-USD used, 5 window ms, 6 sub-buckets,
--       7 the key's budget nano-USD (-1 = none), 8 the key's alert thresholds ('50,80,100'
--       percent, '-' = none)
-- Returns {applied, crossings...}: applied 1, or 0 when the request id holds nothing (already
-- settled or unknown); then per alert threshold this settle's spend crossed: scope, period,
-- window, threshold percent, spent after, budget (nano-USD). Spend only grows within a window
-- and every settle runs alone, so exactly one settle crosses each threshold of a window.
local used_tokens, used_nanos = tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[2] == 'release' then
  used_tokens, used_nanos = 0, 0
end
local window_ms, buckets = tonumber(ARGV[5]), tonumber(ARGV[6])
local bucket_ms = window_ms / buckets
local cur = math.floor(now_ms() / bucket_ms)
local applied = 0
local crossings = {}

-- The budget and alert thresholds of scope s for one period (nil when it has none).
local function alert_rule(s, period)
  if s == 1 then
    local limit = tonumber(ARGV[7]) or -1
    if limit <= 0 or ARGV[8] == '-' then
      return nil
    end
    return limit, split(ARGV[8], ',')
  end
  local record = KEYS[2 * SCOPE + 1]
  if record == nil then
    return nil
  end
  local rule = redis.call('HMGET', record, 'budget_' .. period .. '_nanos', 'alert_thresholds')
  local limit = tonumber(rule[1]) or -1
  if limit <= 0 or not rule[2] or rule[2] == '' then
    return nil
  end
  return limit, split(rule[2], ',')
end

-- Thresholds are whole percents 1..100: ceil(limit * t / 100), exact below 2^53.
local function threshold_nanos(limit, percent)
  return math.floor(limit / 100) * percent + math.ceil((limit % 100) * percent / 100)
end

local function note_crossings(s, period, window, before, after)
  local limit, thresholds = alert_rule(s, period)
  if limit == nil then
    return
  end
  for _, text in ipairs(thresholds) do
    local percent = tonumber(text)
    local need = threshold_nanos(limit, percent)
    if before < need and after >= need then
      for _, v in ipairs({s, period, window, percent, int(after), int(limit)}) do
        crossings[#crossings + 1] = v
      end
    end
  end
end

for s = 1, math.floor(#KEYS / SCOPE) do
  local value = redis.call('HGET', key_of(s, HELD), ARGV[1])
  if value then
    applied = 1
    redis.call('HDEL', key_of(s, HELD), ARGV[1])
    redis.call('ZREM', key_of(s, LEASES), ARGV[1])
    redis.call('ZREM', key_of(s, INFLIGHT), ARGV[1])
    local est_tokens, est_nanos, bucket, periods, windows, reclaimed = parse_hold(value)
    -- refunds go back to the sub-bucket they were taken from, while it is still in the window
    local in_window = bucket > cur - buckets
    local exact = s == 1 and redis.call('HEXISTS', key_of(1, STATE), 'left') == 1
    if ARGV[2] == 'release' and in_window then
      refund_bucket(key_of(s, RPM), bucket, 1, exact)
    end
    local extra = used_tokens - est_tokens
    if extra < 0 and in_window then
      refund_bucket(key_of(s, TPM), bucket, -extra, exact)
    elseif extra > 0 then
      -- tokens beyond the estimate were spent now: charge them to the current sub-bucket
      redis.call('HINCRBY', key_of(s, TPM), int(cur), int(extra))
      redis.call('PEXPIRE', key_of(s, TPM), int(window_ms + bucket_ms))
    end
    for i, period in ipairs(periods) do
      local at = BUDGET_AT[period]
      local window, spent = nil, 0
      if at then
        window, spent = budget_state(key_of(s, at))
      end
      if at and window == windows[i] then
        if not reclaimed then
          redis.call('HINCRBY', key_of(s, at), 'reserved', int(-est_nanos))
        end
        if used_nanos > 0 then
          redis.call('HINCRBY', key_of(s, at), 'spent', int(used_nanos))
          if not exact then -- a scope the key has left: its spend is carried, not alerted
            note_crossings(s, period, window, spent, spent + used_nanos)
          end
        end
      end
    end
  end
end
local reply = {applied}
for _, v in ipairs(crossings) do
  reply[#reply + 1] = v
end
return reply
