-- Settle (ARGV 2 = 'settle') or release (= 'release') one reservation, exactly once.
-- ARGV: 1 request id, 2 mode, 3 tokens used, 4 nano-USD used, 5 window ms, 6 sub-buckets
-- Returns 1 when applied, 0 when the request id holds nothing (already settled or unknown).
local value = redis.call('HGET', KEYS[3], ARGV[1])
if not value then
  return 0
end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])

local est_tokens, est_nanos, bucket, period, window, reclaimed = parse_hold(value)
local used_tokens, used_nanos = tonumber(ARGV[3]), tonumber(ARGV[4])
local window_ms, buckets = tonumber(ARGV[5]), tonumber(ARGV[6])
local bucket_ms = window_ms / buckets
local cur = math.floor(now_ms() / bucket_ms)
-- refunds go back to the sub-bucket they were taken from, while it is still in the window
local in_window = bucket > cur - buckets

if ARGV[2] == 'release' then
  used_tokens, used_nanos = 0, 0
  if in_window then
    refund_bucket(KEYS[1], bucket, 1)
  end
end

local extra = used_tokens - est_tokens
if extra < 0 and in_window then
  refund_bucket(KEYS[2], bucket, -extra)
elseif extra > 0 then
  -- tokens beyond the estimate were spent now: charge them to the current sub-bucket
  redis.call('HINCRBY', KEYS[2], int(cur), int(extra))
  redis.call('PEXPIRE', KEYS[2], int(window_ms + bucket_ms))
end

local index = BUDGET_KEY[period]
if index and budget_state(KEYS[index]) == window then
  if not reclaimed then
    redis.call('HINCRBY', KEYS[index], 'reserved', int(-est_nanos))
  end
  if used_nanos > 0 then
    redis.call('HINCRBY', KEYS[index], 'spent', int(used_nanos))
  end
end
return 1
