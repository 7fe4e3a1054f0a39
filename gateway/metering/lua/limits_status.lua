-- Current usage of one scope (a key's or a team's), for admin views.
-- ARGV: 1 window ms, 2 sub-buckets
-- Returns {now, rpm used, tpm used, rpm reset ms, tpm reset ms, holds (budget leases),
--          requests in flight, then per period (day, week, month, total): window, window end
--          ms, spent, reserved}
local window_ms, buckets = tonumber(ARGV[1]), tonumber(ARGV[2])
local bucket_ms = window_ms / buckets
local now = now_ms()
local cur = math.floor(now / bucket_ms)
local requests = window_open(key_of(1, RPM), cur, buckets)
local tokens = window_open(key_of(1, TPM), cur, buckets)
window_save(requests, now, bucket_ms) -- the sub-buckets that slid out stay out
window_save(tokens, now, bucket_ms)
local reply = {now, requests.total, tokens.total, window_reset(requests, now, bucket_ms),
  window_reset(tokens, now, bucket_ms), redis.call('ZCARD', key_of(1, LEASES)), in_flight(1, now)}
for _, period in ipairs(PERIODS) do
  local window, window_end = budget_window(period, now)
  local stored, spent, held = budget_state(key_of(1, BUDGET_AT[period]))
  if stored ~= window then
    spent, held = 0, 0
  end
  for _, v in ipairs({window, int(window_end), int(spent), int(held)}) do
    reply[#reply + 1] = v
  end
end
return reply
