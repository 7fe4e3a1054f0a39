-- Apply one transfer (limits_move_out.lua) to the scope it was sent to, exactly once.
-- ARGV: 1 source home, 2 transfer seq, 3 move epoch, 4 items, 5 window ms, 6 sub-buckets
-- Items: 'r'|'t' bucket amount (requests, tokens), 'b' period window spent reserved, and
-- 'f' count, then count pairs of request id and in-flight deadline.
-- Returns {status, left epoch}: 'dup' (applied before), 'ok', or 'left' when this scope is no
-- longer the key's home either (its own move carries the amounts on).
local source, seq, epoch = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local window_ms, buckets = tonumber(ARGV[5]), tonumber(ARGV[6])
local bucket_ms = window_ms / buckets
local state = key_of(1, STATE)
if (tonumber(redis.call('HGET', state, 'in:' .. source)) or 0) >= seq then
  return {'dup', 0}
end
local now = now_ms()
local cur = math.floor(now / bucket_ms)
local items = split(ARGV[4], ' ')
-- the request and token windows, opened with every sub-bucket the transfer adds to
local windows = {}
do
  local wanted = {r = {}, t = {}}
  local i = 1
  while i <= #items do
    local tag = items[i]
    if tag == 'r' or tag == 't' then
      local bucket = tonumber(items[i + 1])
      if bucket > cur - buckets then
        wanted[tag][#wanted[tag] + 1] = bucket
      end
      i = i + 3
    elseif tag == 'b' then
      i = i + 5
    elseif tag == 'f' then
      i = i + 2 + 2 * tonumber(items[i + 1])
    else
      return redis.error_reply('unknown transfer item ' .. tag)
    end
  end
  for tag, slot in pairs({r = RPM, t = TPM}) do
    if #wanted[tag] > 0 then
      windows[tag] = window_open(key_of(1, slot), cur, buckets, wanted[tag])
    end
  end
end
local i = 1
while i <= #items do
  local tag = items[i]
  if tag == 'r' or tag == 't' then
    local bucket, amount = tonumber(items[i + 1]), tonumber(items[i + 2])
    if bucket > cur - buckets then
      window_add(windows[tag], bucket, amount)
    end
    i = i + 3
  elseif tag == 'b' then
    local period, window = items[i + 1], items[i + 2]
    local spent, held = tonumber(items[i + 3]), tonumber(items[i + 4])
    local current, window_end = budget_window(period, now)
    local key = key_of(1, BUDGET_AT[period])
    if window == current then -- a past window no longer limits anything
      if budget_state(key) == current then
        redis.call('HINCRBY', key, 'spent', int(spent))
        redis.call('HINCRBY', key, 'reserved', int(held))
      else
        redis.call('HSET', key, 'window', current, 'spent', int(spent), 'reserved', int(held),
          'unit', 'nano')
      end
      if window_end >= 0 then
        redis.call('PEXPIRE', key, int(window_end - now + DAY_MS))
      end
    end
    i = i + 5
  elseif tag == 'f' then
    local count = tonumber(items[i + 1])
    local key, prefix = key_of(1, INFLIGHT), source .. '|'
    local incoming, latest = {}, now
    for j = 1, count do
      incoming[prefix .. items[i + 2 * j]] = items[i + 2 * j + 1]
      latest = math.max(latest, tonumber(items[i + 2 * j + 1]))
    end
    for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do
      if string.sub(member, 1, #prefix) == prefix and not incoming[member] then
        redis.call('ZREM', key, member)
      end
    end
    for member, deadline in pairs(incoming) do
      redis.call('ZADD', key, deadline, member)
    end
    if count > 0 then
      redis.call('PEXPIRE', key, int(latest - now + window_ms))
    end
    i = i + 2 + 2 * count
  end
end
for _, window in pairs(windows) do
  window_save(window, now, bucket_ms)
end
redis.call('HSET', state, 'in:' .. source, int(seq))
redis.call('PERSIST', state)
local st = redis.call('HMGET', state, 'epoch', 'left')
if epoch > (tonumber(st[1]) or 0) then
  redis.call('HSET', state, 'epoch', epoch)
end
local left = tonumber(st[2])
if left and epoch >= left then
  -- the key came back to this home
  redis.call('HDEL', state, 'left', 'to')
  left = nil
end
if left then
  return {'left', left}
end
return {'ok', 0}
