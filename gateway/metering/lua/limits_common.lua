-- Shared prelude of the limiter scripts (prepended to each one by gateway/metering/limits.py,
-- with the parts it calls: limits_windows.lua, limits_calendar.lua, limits_holds.lua).
-- A scope is the limiter state of one API key, or of one team; its 10 keys sit in one hash
-- slot ({key:<id>} for a key without a team, {team:<t>} for a team and every key of it):
--   1 rpm      hash  sub-bucket index -> requests; total, oldest, newest (limits_windows.lua)
--   2 tpm      hash  sub-bucket index -> tokens; total, oldest, newest
--   3 held     hash  request id -> "tokens nanos bucket periods windows n f|-[ r]"
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
local MAX_EXACT = 9007199254740992 -- 2^53: integers below it are exact in a Lua number

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
