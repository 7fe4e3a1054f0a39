-- Settle (mode 'settle') or release (mode 'release') reservations of one key, each exactly
-- once, in every scope it was taken in (KEYS: the key's scope, then its team's). For a key of
-- a team KEYS end with the team record (its budgets and alert thresholds).
-- ARGV: 1 window ms, 2 sub-buckets, then per reservation 6 values: request id, mode, tokens
--       used, nano-USD used, the key's budget nano-USD (-1 = none), the key's alert thresholds
--       ('50,80,100' percent, '-' = none)
-- Returns {applied 1, ..., applied n, crossings...}: per reservation 1, or 0 when its request
-- id holds nothing (already settled or unknown); then per alert threshold a settle's spend
-- crossed: its reservation (1..n), scope, period, window, threshold percent, spent after,
-- budget (nano-USD). The reservations apply in order, as separate calls would: spend only
-- grows within a window and every call runs alone, so exactly one settle crosses each
-- threshold of a window.
local window_ms, buckets = tonumber(ARGV[1]), tonumber(ARGV[2])
local bucket_ms = window_ms / buckets
local now = now_ms()
local cur = math.floor(now / bucket_ms)
local live_from = cur - buckets + 1
local ITEM = 6
local count = (#ARGV - 2) / ITEM
local rids = {}
for i = 1, count do
  rids[i] = ARGV[2 + (i - 1) * ITEM + 1]
end
local applied = {}
for i = 1, count do
  applied[i] = 0
end
local crossings = {}

-- The budget and alert thresholds of scope s for one period (nil when it has none); a team's
-- are read from its record once per call.
local team_rules = {}
local function alert_rule(s, item, period)
  if s == 1 then
    local limit = tonumber(ARGV[item + 5]) or -1
    if limit <= 0 or ARGV[item + 6] == '-' then
      return nil
    end
    return limit, split(ARGV[item + 6], ',')
  end
  local record = KEYS[2 * SCOPE + 1]
  if record == nil then
    return nil
  end
  if team_rules[period] == nil then
    local rule = redis.call('HMGET', record, 'budget_' .. period .. '_nanos', 'alert_thresholds')
    local limit = tonumber(rule[1]) or -1
    if limit <= 0 or not rule[2] or rule[2] == '' then
      team_rules[period] = false
    else
      team_rules[period] = {limit, split(rule[2], ',')}
    end
  end
  if not team_rules[period] then
    return nil
  end
  return team_rules[period][1], team_rules[period][2]
end

-- Thresholds are whole percents 1..100: ceil(limit * t / 100), exact below 2^53.
local function threshold_nanos(limit, percent)
  return math.floor(limit / 100) * percent + math.ceil((limit % 100) * percent / 100)
end

local function note_crossings(s, i, item, period, window, before, after)
  local limit, thresholds = alert_rule(s, item, period)
  if limit == nil then
    return
  end
  for _, text in ipairs(thresholds) do
    local percent = tonumber(text)
    local need = threshold_nanos(limit, percent)
    if before < need and after >= need then
      for _, v in ipairs({i, s, period, window, percent, after, limit}) do
        crossings[#crossings + 1] = v
      end
    end
  end
end

for s = 1, math.floor(#KEYS / SCOPE) do
  local values = redis.call('HMGET', key_of(s, HELD), unpack(rids))
  local holds, found, buckets_wanted, seen, flying = {}, {}, {}, {}, {}
  for i = 1, count do
    if values[i] and not seen[rids[i]] then -- a request id twice in one call settles once
      seen[rids[i]] = true
      local hold = {parse_hold(values[i])}
      holds[i] = hold
      found[#found + 1] = rids[i]
      if hold[7] ~= false then -- it holds an in-flight slot, or may (an older entry)
        flying[#flying + 1] = rids[i]
      end
      if hold[3] >= live_from then
        buckets_wanted[#buckets_wanted + 1] = hold[3]
      end
    end
  end
  if #found > 0 then
    redis.call('HDEL', key_of(s, HELD), unpack(found))
    redis.call('ZREM', key_of(s, LEASES), unpack(found))
    if #flying > 0 then
      redis.call('ZREM', key_of(s, INFLIGHT), unpack(flying))
    end
    -- in a scope the key has left, refunds are exact: its counts were carried to the new home,
    -- and the difference goes there with the next transfer
    local exact = s == 1 and redis.call('HEXISTS', key_of(1, STATE), 'left') == 1
    local requests, tokens = nil, nil
    local budgets = {}
    for i = 1, count do
      local hold = holds[i]
      if hold then
        applied[i] = 1
        local item = 2 + (i - 1) * ITEM
        local release = ARGV[item + 2] == 'release'
        local used_tokens, used_nanos = tonumber(ARGV[item + 3]), tonumber(ARGV[item + 4])
        if release then
          used_tokens, used_nanos = 0, 0
        end
        local est_tokens, est_nanos, bucket, periods, windows, reclaimed = unpack(hold)
        local budget_only = hold[8]
        if budget_only then -- a budget hold took no request and counts no tokens
          used_tokens = est_tokens
        end
        -- refunds go back to the sub-bucket they were taken from, while it is in the window
        local in_window = bucket >= live_from
        if release and in_window and not budget_only then
          requests = requests or window_open(key_of(s, RPM), cur, buckets, buckets_wanted)
          local take = exact and 1 or math.min(window_amount(requests, bucket), 1)
          if take > 0 then
            window_add(requests, bucket, -take)
          end
        end
        local extra = used_tokens - est_tokens
        if extra ~= 0 and (extra > 0 or in_window) then
          tokens = tokens or window_open(key_of(s, TPM), cur, buckets, buckets_wanted)
          if extra > 0 then
            -- tokens beyond the estimate were spent now: charged to the current sub-bucket
            window_add(tokens, cur, extra)
          else
            local take = exact and -extra or math.min(window_amount(tokens, bucket), -extra)
            if take > 0 then
              window_add(tokens, bucket, -take)
            end
          end
        end
        for p, period in ipairs(periods) do
          local at = BUDGET_AT[period]
          if at then
            local b = budgets[at]
            if b == nil then
              local window, spent, held = budget_state(key_of(s, at))
              b = {window = window, spent = spent, held = held, add_spent = 0, add_held = 0}
              budgets[at] = b
            end
            if b.window == windows[p] then
              if not reclaimed then
                b.add_held = b.add_held - est_nanos
              end
              if used_nanos > 0 then
                if not exact then -- a scope the key has left: its spend is carried, not alerted
                  note_crossings(s, i, item, period, b.window, b.spent, b.spent + used_nanos)
                end
                b.spent, b.add_spent = b.spent + used_nanos, b.add_spent + used_nanos
              end
            end
          end
        end
      end
    end
    if requests then
      window_save(requests, now, bucket_ms)
    end
    if tokens then
      window_save(tokens, now, bucket_ms)
    end
    for at, b in pairs(budgets) do
      local held = b.held + b.add_held
      if b.add_spent == 0 and b.add_held == 0 then
        -- nothing to write
      elseif math.abs(b.spent) < MAX_EXACT and math.abs(b.held) < MAX_EXACT
          and math.abs(held) < MAX_EXACT then
        redis.call('HSET', key_of(s, at), 'spent', int(b.spent), 'reserved', int(held))
      else -- beyond what a double holds exactly: Redis adds, in 64-bit integers
        redis.call('HINCRBY', key_of(s, at), 'spent', int(b.add_spent))
        redis.call('HINCRBY', key_of(s, at), 'reserved', int(b.add_held))
      end
    end
  end
end
local reply = applied
for _, v in ipairs(crossings) do
  reply[#reply + 1] = v
end
return reply
