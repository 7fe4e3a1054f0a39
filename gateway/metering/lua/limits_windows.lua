-- Sliding windows of sub-buckets (part of the limiter scripts' prelude, limits_common.lua).
-- A window hash holds sub-bucket index -> amount, and three running fields: `total`, the sum of
-- every sub-bucket field in the hash; `oldest`, no sub-bucket older than it is left; `newest`,
-- the newest sub-bucket written. A call first slides the window: the sub-buckets that left it
-- are taken out of `total` and deleted, each once, so knowing the usage costs a few fields
-- whatever the number of sub-buckets. A hash written before these fields existed is summed
-- once (`window_rebuild`). Every write of a sub-bucket goes through `window_add`, which keeps
-- `total` its sum, and `window_save`.

-- Sum the sub-buckets of a hash that has no running fields (or inconsistent ones), dropping
-- the ones that slid out. The hash expires as window_save makes it.
local function window_rebuild(w, live_from)
  local flat = redis.call('HGETALL', w.key)
  local total, newest = 0, nil
  for i = 1, #flat, 2 do
    local bucket = tonumber(flat[i])
    if bucket ~= nil and bucket >= live_from then
      total = total + tonumber(flat[i + 1])
      if newest == nil or bucket > newest then
        newest = bucket
      end
    end
  end
  w.total, w.oldest, w.newest = total, live_from, newest
  w.dirty, w.grew = newest ~= nil, newest ~= nil -- saved with its expiry
  if newest == nil then
    redis.call('DEL', w.key)
    return
  end
  -- written again with the running fields first: Redis looks fields of a small hash up from
  -- its front, and these are read on every call
  local fields = {'total', int(total), 'oldest', int(live_from), 'newest', int(newest)}
  for i = 1, #flat, 2 do
    local bucket = tonumber(flat[i])
    if bucket ~= nil and bucket >= live_from then
      fields[#fields + 1], fields[#fields + 2] = flat[i], flat[i + 1]
    end
  end
  redis.call('DEL', w.key)
  redis.call('HSET', w.key, unpack(fields))
end

-- The window of `key` at sub-bucket `cur`, slid. Its amount at `cur` is read in the same call,
-- and so are those of the sub-buckets in `wanted` (nil: none) that are still in the window.
local function window_open(key, cur, buckets, wanted)
  local live_from = cur - buckets + 1
  local got
  local w = {key = key, cur = cur, buckets = buckets, dirty = false, grew = false}
  if wanted == nil then
    got = redis.call('HMGET', key, 'total', 'oldest', 'newest', int(cur))
    w.at_cur = tonumber(got[4]) or 0
  else
    local names = {'total', 'oldest', 'newest', int(cur)}
    for _, bucket in ipairs(wanted) do
      names[#names + 1] = int(bucket)
    end
    got = redis.call('HMGET', key, unpack(names))
    w.at_cur = tonumber(got[4]) or 0
    w.amounts, w.changed = {}, {}
    for i, bucket in ipairs(wanted) do
      w.amounts[bucket] = tonumber(got[4 + i]) or 0
    end
  end
  w.total, w.oldest, w.newest = tonumber(got[1]), tonumber(got[2]), tonumber(got[3])
  if w.total == nil or w.oldest == nil or w.newest == nil then
    window_rebuild(w, live_from)
  elseif w.newest < live_from then
    -- every sub-bucket slid out
    redis.call('DEL', key)
    w.total, w.oldest, w.newest = 0, live_from, nil
  elseif w.oldest < live_from then
    if live_from - w.oldest > buckets then
      window_rebuild(w, live_from)
    else
      local stale = {}
      for bucket = w.oldest, live_from - 1 do
        stale[#stale + 1] = int(bucket)
      end
      local amounts = redis.call('HMGET', key, unpack(stale))
      local gone, present = 0, {}
      for i, name in ipairs(stale) do
        local amount = tonumber(amounts[i])
        if amount then
          gone = gone + amount
          present[#present + 1] = name
        end
      end
      if #present > 0 then
        redis.call('HDEL', key, unpack(present))
      end
      w.total, w.oldest, w.dirty = w.total - gone, live_from, true
    end
  end
  return w
end

-- The amount of a sub-bucket opened with the window (`cur` or one it wanted).
local function window_amount(w, bucket)
  if bucket == w.cur then
    return w.at_cur
  end
  return w.amounts[bucket]
end

-- Add `amount` (negative: take back) to a sub-bucket opened with the window.
local function window_add(w, bucket, amount)
  if bucket == w.cur then
    w.at_cur, w.cur_changed = w.at_cur + amount, true
  else
    w.amounts[bucket], w.changed[bucket] = w.amounts[bucket] + amount, true
  end
  w.total = w.total + amount
  if bucket < w.oldest then -- the server clock went back
    w.oldest = bucket
  end
  if w.newest == nil or bucket > w.newest then
    w.newest, w.grew = bucket, true
  end
  w.dirty = true
end

-- Write what changed in one HSET; the hash expires once its newest sub-bucket slid out.
local function window_save(w, now, bucket_ms)
  if not w.dirty or w.newest == nil then
    return
  end
  if w.changed == nil or next(w.changed) == nil then
    if w.cur_changed then
      redis.call('HSET', w.key, 'total', int(w.total), 'oldest', int(w.oldest),
        'newest', int(w.newest), int(w.cur), int(w.at_cur))
    else
      redis.call('HSET', w.key, 'total', int(w.total), 'oldest', int(w.oldest),
        'newest', int(w.newest))
    end
  else
    local fields = {'total', int(w.total), 'oldest', int(w.oldest), 'newest', int(w.newest)}
    if w.cur_changed then
      fields[#fields + 1], fields[#fields + 2] = int(w.cur), int(w.at_cur)
    end
    for bucket in pairs(w.changed) do
      fields[#fields + 1], fields[#fields + 2] = int(bucket), int(w.amounts[bucket])
    end
    redis.call('HSET', w.key, unpack(fields))
  end
  if w.grew then
    redis.call('PEXPIRE', w.key, int((w.newest + w.buckets + 1) * bucket_ms - now))
  end
end

-- The ms until the window's newest sub-bucket (nil: none, 0) slides out, when its usage is
-- back to zero.
local function window_reset(w, now, bucket_ms)
  if w.newest == nil then
    return 0
  end
  return (w.newest + w.buckets) * bucket_ms - now
end

-- The live {bucket, amount} pairs of an opened window, oldest first, with what this call added
-- at `cur` (for a refusal's Retry-After).
local function window_live(w, live_from)
  local flat = redis.call('HGETALL', w.key)
  local live, seen_cur = {}, false
  for i = 1, #flat, 2 do
    local bucket = tonumber(flat[i])
    if bucket ~= nil and bucket >= live_from then
      local amount = tonumber(flat[i + 1])
      if bucket == w.cur then
        amount, seen_cur = w.at_cur, true
      end
      live[#live + 1] = {bucket, amount}
    end
  end
  if not seen_cur and w.at_cur ~= 0 then
    live[#live + 1] = {w.cur, w.at_cur}
  end
  table.sort(live, function(a, b) return a[1] < b[1] end)
  return live
end
