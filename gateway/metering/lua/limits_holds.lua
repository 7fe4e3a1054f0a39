-- Holds, budgets and leases of a scope (part of the limiter scripts' prelude, limits_common.lua).
-- tokens, nanos, bucket, periods, windows, reclaimed, in flight. Periods and windows are comma
-- lists (a team may hold several budgets), '-' for none. The trailing flags: ' n' = the amount
-- is in nano-dollars (entries without it are older, in micro-dollars), then ' f' = it holds an
-- in-flight slot, ' -' = it holds none (older entries say neither: nil, perhaps), then ' b' =
-- a budget hold (it took no request and no tokens), then ' r' = its budget hold was already
-- given back by a lease reclaim.
local function parse_hold(value)
  local t, m, b, p, w, rest = string.match(value, '^(%d+) (%d+) (%-?%d+) (%S+) (%S+)(.*)$')
  local nanos = tonumber(m)
  if not string.find(rest, 'n', 1, true) then
    nanos = nanos * NANOS_PER_MICRO
  end
  local flying = nil
  if string.find(rest, 'f', 1, true) then
    flying = true
  elseif string.find(rest, '-', 1, true) then
    flying = false
  end
  return tonumber(t), nanos, tonumber(b), split(p, ','), split(w, ','),
    string.sub(rest, -2) == ' r', flying, string.find(rest, 'b', 1, true) ~= nil
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
