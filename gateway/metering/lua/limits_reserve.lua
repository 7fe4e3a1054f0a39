-- Check and take, for each request in turn, 1 request, its tokens and its nano-USD of budget in
-- every scope of its key (the key's, and its team's), all or nothing per request: the same
-- verdicts as one call per request in that order, in one call.
-- KEYS: the key's scope; for a key of a team, then the team's scope and the team record.
-- ARGV: 1 window ms, 2 sub-buckets per window, 3 lease ms, 4 in-flight lease ms, 5 the key's
--       home epoch (from its record), 6 key rpm, 7 key tpm, 8 key budget nano-USD, 9 key
--       budget period, 10 key max parallel requests (-1 = no limit), 11 '1' when the key's
--       budget is soft (a soft budget is held and charged, and alerts, but never refuses; a
--       team's is soft when its record has budget_mode = soft), 12 '1' for budget holds (a
--       provider's batch: only budgets are checked and held; no request, tokens or in-flight
--       slot is counted, and the settle charges money only); then per request 3 values:
--       request id, tokens, nano-USD.
-- Returns one reply per request:
--      {1, now, key budget window, in-flight scopes (bit 1 key, bit 2 team), stats...}
--   or {0, reason, retry ms (-1 = never fits), now, scope, limit, used, held, period, stats...}
--      where stats are, per scope: rpm limit, rpm used, rpm reset ms, tpm limit, tpm used,
--      tpm reset ms (after the take when admitted);
--   or {-1} when the request id already holds a reservation, {-2} when the key's state has
--      moved to another home (the caller's key record is stale), {-3} while a move into this
--      home is still being carried over.
local window_ms, buckets = tonumber(ARGV[1]), tonumber(ARGV[2])
local lease_ms, flight_ms, epoch = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local bucket_ms = window_ms / buckets
local FIRST, ITEM = 13, 3
local budget_only = ARGV[12] == '1'
local count = (#ARGV - FIRST + 1) / ITEM
local replies = {}

local home = redis.call('HMGET', key_of(1, STATE), 'epoch', 'left')
local left = tonumber(home[2])
local stale = left and (left > epoch and -2 or -3)
if not left and (tonumber(home[1]) or 0) < epoch then
  stale = -3
end
if stale then
  for i = 1, count do
    replies[i] = {stale}
  end
  return replies
end

local rids = {}
for i = 1, count do
  rids[i] = ARGV[FIRST + (i - 1) * ITEM]
end
local taken = redis.call('HMGET', key_of(1, HELD), unpack(rids))

local function limit_of(value)
  return tonumber(value) or -1
end

local scopes = {{rpm = tonumber(ARGV[6]), tpm = tonumber(ARGV[7]),
  parallel = tonumber(ARGV[10]), budgets = {}}}
if tonumber(ARGV[8]) >= 0 then
  scopes[1].budgets[1] = {period = ARGV[9], limit = tonumber(ARGV[8]), soft = ARGV[11] == '1'}
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
local live_from = cur - buckets + 1

-- Measure every scope first: nothing is taken unless everything fits.
for s, scope in ipairs(scopes) do
  reclaim_lapsed(s, now, lease_ms, 8)
  scope.requests = window_open(key_of(s, RPM), cur, buckets)
  scope.tokens = window_open(key_of(s, TPM), cur, buckets)
  for _, b in ipairs(scope.budgets) do
    b.window, b.window_end = budget_window(b.period, now)
    local stored
    stored, b.spent, b.held = budget_state(key_of(s, BUDGET_AT[b.period]))
    b.rolled, b.took = stored ~= b.window, 0
    if b.rolled then
      b.spent, b.held = 0, 0
    end
  end
  if scope.parallel >= 0 then
    scope.flying = in_flight(s, now)
  end
  scope.holds, scope.leases, scope.flights = {}, {}, {}
end

-- ms until `need` units have slid out of the window (oldest sub-buckets leave first)
local function wait_for(w, need)
  local freed = 0
  for _, entry in ipairs(window_live(w, live_from)) do
    freed = freed + entry[2]
    if freed >= need then
      return (entry[1] + buckets) * bucket_ms - now
    end
  end
  return window_ms
end

local function add_stats(reply)
  for _, scope in ipairs(scopes) do
    local requests, tokens = scope.requests, scope.tokens
    reply[#reply + 1] = scope.rpm
    reply[#reply + 1] = requests.total
    reply[#reply + 1] = window_reset(requests, now, bucket_ms)
    reply[#reply + 1] = scope.tpm
    reply[#reply + 1] = tokens.total
    reply[#reply + 1] = window_reset(tokens, now, bucket_ms)
  end
  return reply
end

-- Admission: budget - spent - held > 0 and estimate <= budget - spent - held. Written as
-- differences so that every intermediate stays an exact integer below 2^53.
local function refusal(scope, tokens, nanos)
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
  if budget_only then
    return nil
  end
  local used = scope.requests.total
  if scope.rpm >= 0 and used + 1 > scope.rpm then
    local retry = scope.rpm == 0 and -1 or wait_for(scope.requests, used + 1 - scope.rpm)
    return 'rpm', retry, scope.rpm, used, 0, '-'
  end
  used = scope.tokens.total
  if scope.tpm >= 0 and used + tokens > scope.tpm then
    local retry = tokens > scope.tpm and -1 or wait_for(scope.tokens, used + tokens - scope.tpm)
    return 'tpm', retry, scope.tpm, used, 0, '-'
  end
  if scope.parallel >= 0 and scope.flying + 1 > scope.parallel then
    return 'parallel', scope.parallel == 0 and -1 or 1000, scope.parallel, scope.flying, 0, '-'
  end
end

local key_window = scopes[1].budgets[1] and scopes[1].budgets[1].window or ''
local seen = {}
for i = 1, count do
  local item = FIRST + (i - 1) * ITEM
  local rid, tokens, nanos = ARGV[item], tonumber(ARGV[item + 1]), tonumber(ARGV[item + 2])
  if taken[i] or seen[rid] then
    replies[i] = {-1}
  else
    local reply
    for s, scope in ipairs(scopes) do
      local reason, retry, limit, used, held, period = refusal(scope, tokens, nanos)
      if reason then
        reply = add_stats({0, reason, retry, now, s, limit, used, held, period})
        break
      end
    end
    if reply == nil then
      seen[rid] = true
      local flights = 0
      for s, scope in ipairs(scopes) do
        if not budget_only then
          window_add(scope.requests, cur, 1)
        end
        if tokens > 0 and not budget_only then
          window_add(scope.tokens, cur, tokens)
        end
        local periods, windows = {}, {}
        for _, b in ipairs(scope.budgets) do
          b.held, b.took = b.held + nanos, b.took + nanos
          periods[#periods + 1], windows[#windows + 1] = b.period, b.window
        end
        local in_flight_flag = '-'
        if scope.parallel >= 0 and not budget_only then
          scope.flying = scope.flying + 1
          scope.flights[#scope.flights + 1] = int(now + flight_ms)
          scope.flights[#scope.flights + 1] = rid
          flights, in_flight_flag = flights + s, 'f'
        end
        local holds = scope.holds
        holds[#holds + 1] = rid
        holds[#holds + 1] = string.format('%d %d %d %s %s n %s%s', tokens, nanos, cur,
          #periods > 0 and table.concat(periods, ',') or '-',
          #windows > 0 and table.concat(windows, ',') or '-', in_flight_flag,
          budget_only and ' b' or '')
        scope.leases[#scope.leases + 1] = int(now + lease_ms)
        scope.leases[#scope.leases + 1] = rid
      end
      reply = add_stats({1, now, key_window, flights})
    end
    replies[i] = reply
  end
end

-- held and leases hold the same request ids: they expire together, two leases after the
-- newest (a reclaimed hold keeps its marker for one more lease), renewed when that is near.
local hold_ttl = 2 * lease_ms + window_ms
for s, scope in ipairs(scopes) do
  -- also when nothing was taken: the sub-buckets that slid out stay out
  window_save(scope.requests, now, bucket_ms)
  window_save(scope.tokens, now, bucket_ms)
  if #scope.holds > 0 then
    for _, b in ipairs(scope.budgets) do
      local key = key_of(s, BUDGET_AT[b.period])
      if b.rolled then
        redis.call('HSET', key, 'window', b.window, 'spent', 0, 'reserved', int(b.took),
          'unit', 'nano')
        if b.window_end >= 0 then
          -- a day past the window's end, so late settles still find it
          redis.call('PEXPIRE', key, int(b.window_end - now + DAY_MS))
        end
      elseif b.took > 0 then
        redis.call('HINCRBY', key, 'reserved', int(b.took))
      end
    end
    redis.call('HSET', key_of(s, HELD), unpack(scope.holds))
    redis.call('ZADD', key_of(s, LEASES), unpack(scope.leases))
    if redis.call('PTTL', key_of(s, HELD)) < hold_ttl - window_ms then
      redis.call('PEXPIRE', key_of(s, HELD), int(hold_ttl))
      redis.call('PEXPIRE', key_of(s, LEASES), int(hold_ttl))
    end
    if #scope.flights > 0 then
      local key = key_of(s, INFLIGHT)
      redis.call('ZADD', key, unpack(scope.flights))
      if redis.call('PTTL', key) < 2 * flight_ms then
        redis.call('PEXPIRE', key, int(2 * flight_ms + window_ms))
      end
    end
  end
end
return replies
