"""Lua scripts sent by SHA in one pipelined round trip, with NOSCRIPT recovery.

A pipeline cannot fall back on its own when Redis answers NOSCRIPT (a restart, a failover to a
replica, ``SCRIPT FLUSH``): redis-py's answer is to send the whole source with EVAL every time,
which on the hot path costs kilobytes of packing per request. ``ScriptBatch`` sends EVALSHA
(40 bytes) instead; a command that comes back NOSCRIPT is sent again, once, as EVAL with its
source, on the same connection (``DirectRedis``) or to the same slot (a cluster). No SCRIPT LOAD
is involved, so a load can never reach another server than the run (EVAL also leaves the script
cached there for the next EVALSHA). Resending is safe only because every script queued here is
idempotent by request id: a settle or a record that already ran is a no-op.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from gateway.store.connect import RedisClient
from gateway.store.direct import DirectRedis, pipelined_batch


@dataclass(frozen=True, slots=True)
class LuaScript:
    source: str
    sha: str

    @classmethod
    def of(cls, source: str) -> LuaScript:
        return cls(source, hashlib.sha1(source.encode()).hexdigest())


class ScriptBatch:
    """Commands for one round trip; ``execute`` returns their replies in order.

    Replies are those of ``pipeline.execute()``: the first command that failed (after the
    NOSCRIPT retry) raises its error, so a caller treats the batch as all-or-unknown.
    """

    __slots__ = ("_commands", "_fallbacks")

    def __init__(self) -> None:
        self._commands: list[tuple[Any, ...]] = []
        self._fallbacks: list[tuple[Any, ...] | None] = []  # EVAL form of each script run

    def __len__(self) -> int:
        return len(self._commands)

    def call(self, script: LuaScript, keys: list[str], args: list[Any]) -> int:
        """Queue one script run; returns the position of its reply."""
        self._commands.append(("EVALSHA", script.sha, len(keys), *keys, *args))
        self._fallbacks.append(("EVAL", script.source, len(keys), *keys, *args))
        return len(self._commands) - 1

    def command(self, *args: Any) -> int:
        """Queue a plain command (``"SADD", key, member``); returns its reply position."""
        self._commands.append(args)
        self._fallbacks.append(None)
        return len(self._commands) - 1

    async def execute(self, redis: RedisClient | DirectRedis) -> list[Any]:
        """Send on ``redis``; a ``DirectRedis`` skips redis-py's per-call pool machinery."""
        if not self._commands:
            return []
        if isinstance(redis, DirectRedis):
            replies = await redis.batch(self._commands, self._fallbacks)
        else:
            replies = await pipelined_batch(redis, self._commands, self._fallbacks)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies
