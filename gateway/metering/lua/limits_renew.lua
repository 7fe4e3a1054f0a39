-- Extend the in-flight leases of requests still running on this gateway (ARGV 2..n), in one
-- scope's inflight set (KEYS[1]); a request already settled or lapsed is not brought back.
-- ARGV: 1 in-flight lease ms, 2 the set's TTL ms, 3.. request ids
local deadline = now_ms() + tonumber(ARGV[1])
local renewed = 0
for i = 3, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], int(deadline), ARGV[i])
    renewed = renewed + 1
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return renewed
