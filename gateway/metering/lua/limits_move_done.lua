-- Forget a scope the key has left, once nothing can still arrive in it: no hold unsettled, no
-- request in flight, no transfer pending, no count left to carry. The state hash stays a while
-- (ARGV 1 ms) so that a gateway with a key record cached from before the move is still sent on.
-- Returns 1 when the scope was cleared, 0 when it still holds something.
local state = key_of(1, STATE)
if not redis.call('HGET', state, 'left') then
  return 0
end
if redis.call('EXISTS', KEYS[SCOPE + 1]) == 1 or redis.call('HLEN', key_of(1, HELD)) > 0 then
  return 0
end
if in_flight(1, now_ms()) > 0 or redis.call('HGET', state, 'mirrored') == '1' then
  return 0
end
for _, slot in ipairs({RPM, TPM}) do
  local flat = redis.call('HGETALL', key_of(1, slot))
  for i = 1, #flat, 2 do
    if tonumber(flat[i]) ~= nil and tonumber(flat[i + 1]) ~= 0 then -- a sub-bucket left
      return 0
    end
  end
end
for _, period in ipairs(PERIODS) do
  local _, spent, held = budget_state(key_of(1, BUDGET_AT[period]))
  if spent ~= 0 or held ~= 0 then
    return 0
  end
end
for slot = 1, SCOPE - 1 do
  redis.call('DEL', key_of(1, slot))
end
redis.call('PEXPIRE', state, ARGV[1])
return 1
