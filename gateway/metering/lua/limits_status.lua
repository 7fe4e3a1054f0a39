-- Current usage of one key, for admin views.
-- ARGV: 1 budget period, 2 window ms, 3 sub-buckets
-- Returns {now, rpm used, tpm used, rpm reset ms, tpm reset ms, budget window, window end ms,
--          spent, reserved, requests in flight}
local period = ARGV[1]
local window_ms, buckets = tonumber(ARGV[2]), tonumber(ARGV[3])
local bucket_ms = window_ms / buckets
local now = now_ms()
local cur = math.floor(now / bucket_ms)
local rpm_used, rpm_newest = window_usage(KEYS[1], cur - buckets + 1)
local tpm_used, tpm_newest = window_usage(KEYS[2], cur - buckets + 1)
local function reset_ms(newest)
  if newest == nil then
    return 0
  end
  return (newest + buckets) * bucket_ms - now
end
local window, window_end = budget_window(period, now)
local stored_window, stored_spent, stored_held = budget_state(KEYS[BUDGET_KEY[period]])
local spent, held = 0, 0
if stored_window == window then
  spent, held = stored_spent, stored_held
end
return {int(now), int(rpm_used), int(tpm_used), int(reset_ms(rpm_newest)),
  int(reset_ms(tpm_newest)), window, int(window_end), int(spent), int(held),
  redis.call('ZCARD', KEYS[4])}
