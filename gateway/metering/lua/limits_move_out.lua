-- Carry a key's limiter state out of a scope it has left (move epoch ARGV 1) towards its new
-- home (ARGV 2): the first call marks the scope left; every call takes what the scope holds now
-- (live request and token sub-buckets, budget spent and reserved of the current windows, the
-- list of requests in flight) into a transfer record (KEYS[SCOPE + 1]) that the new home
-- applies once (limits_move_in.lua), until the holds of requests reserved here are all settled.
-- ARGV: 1 move epoch, 2 target home, 3 window ms, 4 sub-buckets, 5 lease ms
-- Returns {status, seq, target, epoch, items, holds left, in flight left} where status is
--   'home'    this scope is the key's home again at this epoch or later: nothing to carry
--   'pending' a transfer taken earlier is not acknowledged yet: apply it first
--   'out'     a new transfer
--   'empty'   nothing to carry now
local epoch, target = tonumber(ARGV[1]), ARGV[2]
local window_ms, buckets, lease_ms = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local bucket_ms = window_ms / buckets
local state, out = key_of(1, STATE), KEYS[SCOPE + 1]
local st = redis.call('HMGET', state, 'epoch', 'left', 'seq_epoch', 'seq_n', 'sent', 'mirrored')
if (tonumber(st[1]) or 0) >= epoch then
  return {'home', 0, '', 0, '', 0, 0}
end
local pending = redis.call('HMGET', out, 'seq', 'target', 'epoch', 'items')
if pending[1] then
  return {'pending', pending[1], pending[2], pending[3], pending[4], -1, -1}
end
local now = now_ms()
local cur = math.floor(now / bucket_ms)
local left = tonumber(st[2])
if not left or left < epoch then
  redis.call('HSET', state, 'left', epoch, 'to', target)
  redis.call('PERSIST', state)
end
reclaim_lapsed(1, now, lease_ms, 1000)

local items = {}
local function add(...)
  for _, v in ipairs({...}) do
    items[#items + 1] = v
  end
end
for _, window in ipairs({{'r', RPM}, {'t', TPM}}) do
  local tag, slot = window[1], window[2]
  local flat = redis.call('HGETALL', key_of(1, slot))
  for i = 1, #flat, 2 do
    local bucket, amount = tonumber(flat[i]), tonumber(flat[i + 1])
    if bucket ~= nil and bucket > cur - buckets and amount ~= 0 then -- not a running field
      add(tag, int(bucket), int(amount))
    end
  end
  redis.call('DEL', key_of(1, slot))
end
for _, period in ipairs(PERIODS) do
  local key = key_of(1, BUDGET_AT[period])
  local window, spent, held = budget_state(key)
  if window and (spent ~= 0 or held ~= 0) then
    add('b', period, window, int(spent), int(held))
    redis.call('HSET', key, 'spent', 0, 'reserved', 0)
  end
end
-- Requests in flight here still count at the new home until they end: send the whole list
-- each time (the new home replaces what it had from here), and once more when it empties.
local flights = redis.call('ZRANGEBYSCORE', key_of(1, INFLIGHT), now, '+inf', 'WITHSCORES')
if #flights > 0 or st[6] == '1' then
  add('f', int(#flights / 2))
  for i = 1, #flights, 2 do
    add(flights[i], flights[i + 1])
  end
  redis.call('HSET', state, 'mirrored', #flights > 0 and '1' or '0')
end
local holds = redis.call('HLEN', key_of(1, HELD))
if #items == 0 and (tonumber(st[5]) or 0) >= epoch then
  return {'empty', 0, '', 0, '', holds, #flights / 2}
end
-- The first transfer of a move always goes, even empty: it opens the new home.
local n = tonumber(st[4]) or 0
if tonumber(st[3]) ~= epoch then
  n = 0
end
n = n + 1
local seq = epoch * 1048576 + n
local payload = table.concat(items, ' ')
redis.call('HSET', state, 'seq_epoch', epoch, 'seq_n', n, 'sent', epoch)
redis.call('HSET', out, 'seq', int(seq), 'target', target, 'epoch', epoch, 'items', payload)
return {'out', int(seq), target, epoch, payload, holds, #flights / 2}
