-- Count one outcome that needed no lookup or store (bypass, skip_*) in its scope.
-- KEYS: meta. ARGV: counter, keep_ms, namespace, model. Returns 1 when the scope is new.
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
return touch_meta(KEYS[1], tonumber(ARGV[2]), ARGV[3], ARGV[4])
