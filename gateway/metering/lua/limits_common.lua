-- Shared prelude of the limiter scripts (prepended to each one by gateway/metering/limits.py).
-- A scope is the limiter state of one API key, or of one team; its 10 keys sit in one hash
-- slot ({key:<id>} for a key without a team, {team:<t>} for a team and every key of it):
--   1 rpm      hash  sub-bucket index -> requests
--   2 tpm      hash  sub-bucket index -> tokens
--   3 held     hash  request id -> "tokens nanos bucket periods windows n[ r]"
--   4 leases   zset  request id -> lease deadline (ms); a crashed holder's budget comes back
--   5..8       hash  budget:day / :month / :total / :week -> window, spent, reserved
--                    (nano-USD), unit = 'nano' (week came last, after the others)
--   9 inflight zset  request id -> in-flight lease deadline (ms), for max_parallel_requests
--  10 state    hash  a key scope's home: epoch, left, to, seq, in:<source> (docs/limits.md)
-- Scope s (1-based) starts at KEYS[(s - 1) * SCOPE + 1].
-- Money is integer nano-dollars; Lua numbers are doubles, exact below 2^53 (about $9M), and the
-- gateway keeps budgets and charges below that. Data written before the unit changed holds
-- micro-dollars: held entries without the ' n' marker, budget hashes without unit = 'nano'.
local SCOPE = 10
local RPM, TPM, HELD, LEASES, INFLIGHT, STATE = 1, 2, 3, 4, 9, 10
local BUDGET_AT = {day = 5, month = 6, total = 7, week = 8}
local PERIODS = {'day', 'week', 'month', 'total'}
local NANOS_PER_MICRO = 1000
local DAY_MS = 86400000

-- Lua turns numbers into "%.14g" strings; large counters must go to Redis as integers.
local function int(x)
  return string.format('%d', x)
end

local function key_of(scope, slot)
  return KEYS[(scope - 1) * SCOPE + slot]
end

-- Server time, so that replicas with skewed clocks agree.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function split(text, sep)
  local parts = {}
  if text == nil or text == '' or text == '-' then
    return parts
  end
  for part in string.gmatch(text, '[^' .. sep .. ']+') do
    parts[#parts + 1] = part
  end
  return parts
end

-- Sum the live sub-buckets of a window hash and drop the ones that slid out.
-- Returns the total, the newest live bucket (or nil) and the live {bucket, amount} pairs.
local function window_usage(key, oldest_live)
  local flat = redis.call('HGETALL', key)
  local total, newest, live, stale = 0, nil, {}, {}
  for i = 1, #flat, 2 do
    local bucket = tonumber(flat[i])
    if bucket < oldest_live then
      stale[#stale + 1] = flat[i]
    else
      local amount = tonumber(flat[i + 1])
      total = total + amount
      live[#live + 1] = {bucket, amount}
      if newest == nil or bucket > newest then
        newest = bucket
      end
    end
  end
  if #stale > 0 then
    redis.call('HDEL', key, unpack(stale))
  end
  return total, newest, live
end

-- For a window of `buckets` sub-buckets of `bucket_ms` at `now`: a function giving the ms until
-- the window's newest live sub-bucket (nil: none, 0) slides out, when its usage is back to zero.
local function window_reset(buckets, bucket_ms, now)
  return function(newest)
    if newest == nil then
      return 0
    end
    return (newest + buckets) * bucket_ms - now
  end
end

-- Days since 1970-01-01 <-> proleptic Gregorian date (H. Hinnant's civil algorithms).
local function civil_from_days(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then
    y = y + 1
  end
  return y, m, d
end

local function days_from_civil(y, m, d)
  if m <= 2 then
    y = y - 1
  end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = m > 2 and m - 3 or m + 9
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

-- The UTC budget window holding `now` and when it ends (ms; -1 = never). Weeks are ISO weeks
-- (Monday to Sunday), named by their ISO year and number: "2025-W23".
local function budget_window(period, now)
  if period == 'total' then
    return 'total', -1
  end
  local day = math.floor(now / DAY_MS)
  if period == 'week' then
    local monday = day - (day + 3) % 7 -- 1970-01-01 was a Thursday
    local year = civil_from_days(monday + 3) -- the ISO year is the year of its Thursday
    local week = math.floor((monday + 3 - days_from_civil(year, 1, 1)) / 7) + 1
    return string.format('%04d-W%02d', year, week), (monday + 7) * DAY_MS
  end
  local y, m, d = civil_from_days(day)
  if period == 'day' then
    return string.format('%04d-%02d-%02d', y, m, d), (day + 1) * DAY_MS
  end
  if m == 12 then
    return string.format('%04d-%02d', y, m), days_from_civil(y + 1, 1, 1) * DAY_MS
  end
  return string.format('%04d-%02d', y, m), days_from_civil(y, m + 1, 1) * DAY_MS
end

-- tokens, nanos, bucket, periods, windows, reclaimed. Periods and windows are comma lists (a
-- team may hold several budgets), '-' for none. The trailing flags: ' n' = the amount is in
-- nano-dollars (entries without it are older, in micro-dollars), ' r' = its budget hold was
-- already given back by a lease reclaim.
local function parse_hold(value)
  local t, m, b, p, w, rest = string.match(value, '^(%d+) (%d+) (%-?%d+) (%S+) (%S+)(.*)$')
  local nanos = tonumber(m)
  if not string.find(rest, 'n', 1, true) then
    nanos = nanos * NANOS_PER_MICRO
  end
  return tonumber(t), nanos, tonumber(b), split(p, ','), split(w, ','), string.sub(rest, -2) == ' r'
end

-- A budget hash's window, spent and reserved in nano-dollars. A hash from before the unit
-- changed (no unit field) is scaled from micro-dollars in place, once, inside this script.
local function budget_state(key)
  local state = redis.call('HMGET', key, 'window', 'spent', 'reserved', 'unit')
  local spent, held = tonumber(state[2]) or 0, tonumber(state[3]) or 0
  if state[1] and state[4] ~= 'nano' then
    spent, held = spent * NANOS_PER_MICRO, held * NANOS_PER_MICRO
    redis.call('HSET', key, 'spent', int(spent), 'reserved', int(held), 'unit', 'nano')
  end
  return state[1], spent, held
end

-- Give the budget holds of one reservation back, unless a window has rolled over since.
local function unhold_budgets(scope, periods, windows, nanos)
  for i, period in ipairs(periods) do
    local at = BUDGET_AT[period]
    if at and budget_state(key_of(scope, at)) == windows[i] then
      redis.call('HINCRBY', key_of(scope, at), 'reserved', int(-nanos))
    end
  end
end

-- Take up to `amount` back out of one sub-bucket (never below zero), or exactly `amount` in a
-- scope the key has left: its counts were carried to the new home, and the difference goes
-- there with the next transfer.
local function refund_bucket(key, bucket, amount, exact)
  local have = tonumber(redis.call('HGET', key, int(bucket))) or 0
  local take = exact and amount or math.min(have, amount)
  if take > 0 then
    redis.call('HINCRBY', key, int(bucket), int(-take))
  end
end

-- Holds whose lease ran out belong to a gateway that died mid-request: give their budget back
-- but keep a marker for one more lease, so that a late settle still charges what was spent.
local function reclaim_lapsed(scope, now, lease_ms, limit)
  local held, leases = key_of(scope, HELD), key_of(scope, LEASES)
  for _, old in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, limit)) do
    local value = redis.call('HGET', held, old)
    if value and string.sub(value, -2) ~= ' r' then
      local _, old_nanos, _, old_periods, old_windows = parse_hold(value)
      unhold_budgets(scope, old_periods, old_windows, old_nanos)
      redis.call('HSET', held, old, value .. ' r')
      redis.call('ZADD', leases, now + lease_ms, old)
    else
      redis.call('HDEL', held, old)
      redis.call('ZREM', leases, old)
    end
  end
end

-- In-flight requests of a scope, after dropping the ones whose lease lapsed (a dead gateway's).
local function in_flight(scope, now)
  local key = key_of(scope, INFLIGHT)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  return redis.call('ZCARD', key)
end
