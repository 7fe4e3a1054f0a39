-- Add counts of outcomes that needed no lookup or store (bypass, skip_*) to a scope.
-- KEYS: meta. ARGV: counter, amount, keep_ms, namespace, model. Returns 1 when the scope is new.
redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
return touch_meta(KEYS[1], tonumber(ARGV[3]), ARGV[4], ARGV[5])
