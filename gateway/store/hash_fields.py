"""Lua shared by the scripts that write a record hash field by field.

A script starts with ``WRITE_FIELDS_LUA`` and calls ``write_fields(at)``: it sets on ``KEYS[1]``
the field/value pairs counted in ``ARGV[at]`` (they follow it), then deletes the fields named in
the rest of ``ARGV``. The caller passes ``count, field, value, ..., cleared field, ...`` last.
"""

WRITE_FIELDS_LUA = """
local function write_fields(at)
  local pairs_count = tonumber(ARGV[at])
  for i = 0, pairs_count - 1 do
    redis.call('HSET', KEYS[1], ARGV[at + 1 + 2 * i], ARGV[at + 2 + 2 * i])
  end
  for i = at + 1 + 2 * pairs_count, #ARGV do
    redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
"""
