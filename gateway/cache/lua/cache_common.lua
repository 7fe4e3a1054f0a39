-- Shared by the cache scripts. A scope's stats hash (meta) holds its identity (namespace,
-- model), its purge epoch and its counters; it lives at least `keep` ms after its last use.
local function touch_meta(meta, keep, namespace, model)
  local registered = 0
  if redis.call('HSETNX', meta, 'model', model) == 1 then
    redis.call('HSET', meta, 'namespace', namespace)
    registered = 1
  end
  if redis.call('PTTL', meta) < keep then
    redis.call('PEXPIRE', meta, keep)
  end
  return registered
end

