-- Store one entry unless its scope was purged since the lookup (the epoch moved on).
-- KEYS: entry, index, meta. ARGV: hash, value, ttl_ms, epoch, keep_ms, max_entries,
-- namespace, model. The index (a zset: entry hash -> expiry ms) lets purge and stats find the
-- scope's entries without SCAN; past max_entries the entries closest to expiry are dropped
-- from it and returned, for the caller to delete (keys a script did not declare stay out).
-- Returns {1, dropped hashes...} when stored, {0} when the scope was purged meanwhile.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
local keep = math.max(ttl, tonumber(ARGV[5]))
if (redis.call('HGET', KEYS[3], 'epoch') or '0') ~= ARGV[4] then
  redis.call('HINCRBY', KEYS[3], 'skip_purged', 1)
  touch_meta(KEYS[3], keep, ARGV[7], ARGV[8])
  return {0}
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local reply = {1}
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[6])
if excess > 0 then
  local dropped = redis.call('ZRANGE', KEYS[2], 0, math.min(excess, 100) - 1)
  redis.call('ZREM', KEYS[2], unpack(dropped))
  for _, hash in ipairs(dropped) do
    reply[#reply + 1] = hash
  end
end
if redis.call('PTTL', KEYS[2]) < ttl then
  redis.call('PEXPIRE', KEYS[2], ttl)
end
redis.call('HINCRBY', KEYS[3], 'store', 1)
touch_meta(KEYS[3], keep, ARGV[7], ARGV[8])
return reply
