-- Check and take 1 request, ARGV tokens and ARGV nano-USD of budget in every scope of the
-- request (the key's, and its team's), all or nothing.
-- KEYS: the key's scope; for a key of a team, then the team's scope and the team record.
-- ARGV: 1 request id, 2 tokens, 3 nano-USD, 4 window ms, 5 sub-buckets per window, 6 lease ms,
--       7 in-flight lease ms, 8 the key's home epoch (from its record),
--       9 key rpm, 10 key tpm, 11 key budget nano-USD, 12 key budget period,
--       13 key max parallel requests (-1 = no limit), 14 '1' when the key's budget is soft
--       (a soft budget is held and charged, and alerts, but never refuses; a team's is soft
--       when its record has budget_mode = soft)
-- Returns {1, now, key budget window, in-flight scopes (bit 1 key, bit 2 team), stats...}
--      or {0, reason, retry ms (-1 = never fits), now, scope, limit, used, held, period, stats...}
--      where stats are, per scope: rpm limit, rpm used, rpm reset ms, tpm limit, tpm used,
--      tpm reset ms (after the take when admitted);
--      or {-1} when the request id already holds a reservation, {-2} when the key's state has
--      moved to another home (the caller's key record is stale), {-3} while a move into this
--      home is still being carried over.
local rid = ARGV[1]
local tokens, nanos = tonumber(ARGV[2]), tonumber(ARGV[3])
local window_ms, buckets = tonumber(ARGV[4]), tonumber(ARGV[5])
local lease_ms, flight_ms, epoch = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local bucket_ms = window_ms / buckets

local home = redis.call('HMGET', key_of(1, STATE), 'epoch', 'left')
local left = tonumber(home[2])
if left then
  return {left > epoch and -2 or -3}
end
if (tonumber(home[1]) or 0) < epoch then
  return {-3}
end
if redis.call('HEXISTS', key_of(1, HELD), rid) == 1 then
  return {-1}
end

local function limit_of(value)
  return tonumber(value) or -1
end

local scopes = {{rpm = tonumber(ARGV[9]), tpm = tonumber(ARGV[10]),
  parallel = tonumber(ARGV[13]), budgets = {}}}
if tonumber(ARGV[11]) >= 0 then
  scopes[1].budgets[1] = {period = ARGV[12], limit = tonumber(ARGV[11]), soft = ARGV[14] == '1'}
end
if #KEYS > SCOPE then
  local t = redis.call('HMGET', KEYS[2 * SCOPE + 1], 'rpm', 'tpm', 'max_parallel_requests',
    'budget_day_nanos', 'budget_week_nanos', 'budget_month_nanos', 'budget_total_nanos',
    'budget_mode')
  local team = {rpm = limit_of(t[1]), tpm = limit_of(t[2]), parallel = limit_of(t[3]),
    budgets = {}}
  for i, period in ipairs(PERIODS) do
    if t[3 + i] then
      team.budgets[#team.budgets + 1] = {period = period, limit = tonumber(t[3 + i]),
        soft = t[8] == 'soft'}
    end
  end
  scopes[2] = team
end

local now = now_ms()
local cur = math.floor(now / bucket_ms)

local reset_ms = window_reset(buckets, bucket_ms, now)

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

local function stats()
  local out = {}
  for _, scope in ipairs(scopes) do
    for _, v in ipairs({scope.rpm, scope.rpm_used, reset_ms(scope.rpm_newest), scope.tpm,
        scope.tpm_used, reset_ms(scope.tpm_newest)}) do
      out[#out + 1] = int(v)
    end
  end
  return out
end

-- Measure every scope first: nothing is taken unless everything fits.
for s, scope in ipairs(scopes) do
  reclaim_lapsed(s, now, lease_ms, 8)
  scope.rpm_used, scope.rpm_newest, scope.rpm_live = window_usage(key_of(s, RPM),
    cur - buckets + 1)
  scope.tpm_used, scope.tpm_newest, scope.tpm_live = window_usage(key_of(s, TPM),
    cur - buckets + 1)
  for _, b in ipairs(scope.budgets) do
    b.window, b.window_end = budget_window(b.period, now)
    local stored
    stored, b.spent, b.held = budget_state(key_of(s, BUDGET_AT[b.period]))
    b.rolled = stored ~= b.window
    if b.rolled then
      b.spent, b.held = 0, 0
    end
  end
  if scope.parallel >= 0 then
    scope.flying = in_flight(s, now)
  end
end

-- Admission: budget - spent - held > 0 and estimate <= budget - spent - held. Written as
-- differences so that every intermediate stays an exact integer below 2^53.
local function refusal(scope)
  for _, b in ipairs(scope.budgets) do
    local room = b.limit - b.spent - b.held
    if not b.soft and (room <= 0 or nanos > room) then
      local retry = b.window_end
      if b.limit - b.spent > 0 and nanos <= b.limit - b.spent then
        retry = 1000 -- only holds of requests in flight are in the way; they settle soon
      elseif b.window_end >= 0 then
        retry = b.window_end - now
      end
      return 'budget', retry, b.limit, b.spent, b.held, b.period
    end
  end
  if scope.rpm >= 0 and scope.rpm_used + 1 > scope.rpm then
    local retry = scope.rpm == 0 and -1 or wait_for(scope.rpm_live, scope.rpm_used + 1 - scope.rpm)
    return 'rpm', retry, scope.rpm, scope.rpm_used, 0, '-'
  end
  if scope.tpm >= 0 and scope.tpm_used + tokens > scope.tpm then
    local retry = tokens > scope.tpm and -1
      or wait_for(scope.tpm_live, scope.tpm_used + tokens - scope.tpm)
    return 'tpm', retry, scope.tpm, scope.tpm_used, 0, '-'
  end
  if scope.parallel >= 0 and scope.flying + 1 > scope.parallel then
    return 'parallel', scope.parallel == 0 and -1 or 1000, scope.parallel, scope.flying, 0, '-'
  end
end

for s, scope in ipairs(scopes) do
  local reason, retry, limit, used, held, period = refusal(scope)
  if reason then
    local reply = {0, reason, int(retry), int(now), s, int(limit), int(used), int(held), period}
    for _, v in ipairs(stats()) do
      reply[#reply + 1] = v
    end
    return reply
  end
end

local ttl = int(window_ms + bucket_ms)
local hold_ttl = int(2 * lease_ms + window_ms)
local flights = 0
for s, scope in ipairs(scopes) do
  redis.call('HINCRBY', key_of(s, RPM), int(cur), 1)
  redis.call('PEXPIRE', key_of(s, RPM), ttl)
  scope.rpm_used, scope.rpm_newest = scope.rpm_used + 1, cur
  if tokens > 0 then
    redis.call('HINCRBY', key_of(s, TPM), int(cur), int(tokens))
    redis.call('PEXPIRE', key_of(s, TPM), ttl)
    scope.tpm_used, scope.tpm_newest = scope.tpm_used + tokens, cur
  end
  local periods, windows = {}, {}
  for _, b in ipairs(scope.budgets) do
    local key = key_of(s, BUDGET_AT[b.period])
    if b.rolled then
      redis.call('HSET', key, 'window', b.window, 'spent', 0, 'reserved', int(nanos),
        'unit', 'nano')
    else
      redis.call('HINCRBY', key, 'reserved', int(nanos))
    end
    if b.window_end >= 0 then
      -- a day past the window's end, so late settles still find it
      redis.call('PEXPIRE', key, int(b.window_end - now + DAY_MS))
    end
    periods[#periods + 1], windows[#windows + 1] = b.period, b.window
  end
  local joined_periods = #periods > 0 and table.concat(periods, ',') or '-'
  local joined_windows = #windows > 0 and table.concat(windows, ',') or '-'
  redis.call('HSET', key_of(s, HELD), rid,
    string.format('%d %d %d %s %s n', tokens, nanos, cur, joined_periods, joined_windows))
  redis.call('ZADD', key_of(s, LEASES), int(now + lease_ms), rid)
  redis.call('PEXPIRE', key_of(s, HELD), hold_ttl)
  redis.call('PEXPIRE', key_of(s, LEASES), hold_ttl)
  if scope.parallel >= 0 then
    redis.call('ZADD', key_of(s, INFLIGHT), int(now + flight_ms), rid)
    redis.call('PEXPIRE', key_of(s, INFLIGHT), int(2 * flight_ms + window_ms))
    flights = flights + s
  end
end
local key_window = scopes[1].budgets[1] and scopes[1].budgets[1].window or ''
local reply = {1, int(now), key_window, flights}
for _, v in ipairs(stats()) do
  reply[#reply + 1] = v
end
return reply
