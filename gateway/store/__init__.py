"""The Redis parts: connecting (single node or cluster), the direct path, the embedded server
and Lua scripts sent by SHA."""
