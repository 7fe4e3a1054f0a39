-- Start a scope's purge: move its epoch on (a store still in flight from before now is
-- refused) and say how many entries its index holds; the caller then deletes them in batches.
-- KEYS: index, meta. ARGV: keep_ms, namespace, model. Returns the index's size.
redis.call('HINCRBY', KEYS[2], 'epoch', 1)
touch_meta(KEYS[2], tonumber(ARGV[1]), ARGV[2], ARGV[3])
return redis.call('ZCARD', KEYS[1])
