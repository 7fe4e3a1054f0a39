-- Settle (ARGV 2 = 'settle') or release (= 'release') one reservation, exactly once, in every
-- scope it was taken in (KEYS: the key's scope, then its team's).
-- ARGV: 1 request id, 2 mode, 3 tokens used, 4 nano-USD used, 5 window ms, 6 sub-buckets
-- Returns 1 when applied, 0 when the request id holds nothing (already settled or unknown).
local used_tokens, used_nanos = tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[2] == 'release' then
  used_tokens, used_nanos = 0, 0
end
local window_ms, buckets = tonumber(ARGV[5]), tonumber(ARGV[6])
local bucket_ms = window_ms / buckets
local cur = math.floor(now_ms() / bucket_ms)
local applied = 0

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
      if at and budget_state(key_of(s, at)) == windows[i] then
        if not reclaimed then
          redis.call('HINCRBY', key_of(s, at), 'reserved', int(-est_nanos))
        end
        if used_nanos > 0 then
          redis.call('HINCRBY', key_of(s, at), 'spent', int(used_nanos))
        end
      end
    end
  end
end
return applied
