"""Lua scripts sent by SHA in one pipelined round trip, with NOSCRIPT recovery.

A pipeline cannot fall back on its own when Redis answers NOSCRIPT (a restart, a failover to a
replica, ``SCRIPT FLUSH``): redis-py's answer is to send the whole source with EVAL every time,
which on the hot path costs kilobytes of packing per request. ``ScriptBatch`` sends EVALSHA
(40 bytes) instead; when a command comes back NOSCRIPT it loads its scripts (on every master of
a cluster) and sends just those commands again, once. That is safe only because every script
queued here is idempotent by request id: a settle or a record that already ran is a no-op.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError

from gateway.redis_connect import RedisClient
from gateway.redis_direct import DirectRedis


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

    __slots__ = ("_commands", "_scripts")

    def __init__(self) -> None:
        self._commands: list[tuple[Any, ...]] = []
        self._scripts: dict[str, LuaScript] = {}

    def __len__(self) -> int:
        return len(self._commands)

    def call(self, script: LuaScript, keys: list[str], args: list[Any]) -> int:
        """Queue one script run; returns the position of its reply."""
        self._scripts[script.sha] = script
        self._commands.append(("EVALSHA", script.sha, len(keys), *keys, *args))
        return len(self._commands) - 1

    def command(self, *args: Any) -> int:
        """Queue a plain command (``"SADD", key, member``); returns its reply position."""
        self._commands.append(args)
        return len(self._commands) - 1

    async def execute(self, redis: RedisClient | DirectRedis) -> list[Any]:
        """Send on ``redis``; a ``DirectRedis`` skips redis-py's per-call pool machinery."""
        if not self._commands:
            return []
        replies = await _send(redis, self._commands)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            client = redis.client if isinstance(redis, DirectRedis) else redis
            for script in self._scripts.values():
                await client.script_load(script.source)  # a cluster loads it on every master
            again = await _send(redis, [self._commands[i] for i in missing])
            for position, reply in zip(missing, again, strict=True):
                replies[position] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies


async def _send(redis: RedisClient | DirectRedis, commands: list[tuple[Any, ...]]) -> list[Any]:
    if isinstance(redis, DirectRedis):
        return await redis.batch(commands)
    async with redis.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.execute_command(*command)
        return await pipe.execute(raise_on_error=False)
