-- The transfer ARGV 1 was applied at its target: drop the record (KEYS[SCOPE + 1]) so that the
-- next sweep takes what arrived since. Returns 1 when it was the pending one.
local out = KEYS[SCOPE + 1]
if redis.call('HGET', out, 'seq') == ARGV[1] then
  redis.call('DEL', out)
  return 1
end
return 0
