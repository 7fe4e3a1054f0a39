"""Carry a key's limiter counters to its new home when it joins or leaves a team.

A key's limiter state lives in its home's hash slot (``{key:<id>}``, or ``{team:<t>}`` for a
key of team t) so that the key and its team are checked in one script. Moving a key changes
its home; its record says so at once (``KeyStore.update``: new home, a higher home epoch, and an
entry ``<old home>|<epoch>`` in the key's own ``sy:{key:<id>}:moves``). This module then moves
the counters, across slots, without losing or doubling any of them:

1. ``limits_move_out`` marks the old scope *left* (a reserve there is refused as stale, the
   gateway re-reads the record and goes to the new home) and takes what it holds into a transfer
   record: live request/token sub-buckets, budget spent and reserved, the requests in flight.
2. ``limits_move_in`` applies the transfer at its target once (deduplicated by a per-source
   sequence number) and, for the move's first transfer, opens the new home: until then a
   reserve there answers "moving" (the gateway sweeps, then retries), so no request is ever
   admitted against counters that have not arrived.
3. ``limits_move_ack`` drops the transfer record; the next sweep takes what arrived since:
   the settles of requests reserved before the move (they settle where they were reserved,
   and their team keeps its own spend), refunds as negative amounts.
4. Once the old scope holds nothing and can receive nothing more, ``limits_move_done`` clears
   it and the entry is dropped. Entries go in epoch order, and only from the front: amounts
   only ever flow towards newer homes, so an entry whose older ones are gone is final.

Every step is idempotent and any replica may run it: the background sweep (every second, over
``sy:limits:moving``), the admin call that moved the key, or a reserve that found the key's
new home not yet open.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from gateway.access.keys import MOVES_INDEX_KEY, KeyStore, moves_key
from gateway.metering.limits import Limiter, script_source
from gateway.store.connect import REDIS_FAILURES
from gateway.store.direct import DirectRedis
from gateway.store.scripts import LuaScript

SWEEP_INTERVAL_S = 1.0
SWEEP_BATCH = 100
# A cleared scope's state (left, epoch) is kept this long for gateways with an older record.
LEFT_STATE_TTL_MS = 3_600_000
# Finished keys leave the index only if no new move came in since it was read.
_UNINDEX = """
if tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1])) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
"""


@dataclass(frozen=True)
class _Transfer:
    seq: str
    target: str
    epoch: int
    items: str


class LimitMoves:
    """Sweeps pending moves: ``sweep_key`` for one key, ``sweep_pending`` for all."""

    def __init__(self, redis: Redis, keys: KeyStore, limiter: Limiter, log: Any) -> None:
        self.redis = redis
        self.keys = keys
        self.limiter = limiter
        self.log = log
        self._direct = DirectRedis(redis)
        self._out = LuaScript.of(script_source("limits_move_out.lua"))
        self._in = LuaScript.of(script_source("limits_move_in.lua"))
        self._ack = LuaScript.of(script_source("limits_move_ack.lua"))
        self._done = LuaScript.of(script_source("limits_move_done.lua"))
        self._unindex = LuaScript.of(_UNINDEX)

    async def sweep_key(self, key_id: str) -> bool:
        """Carry over what the key's old homes hold now; True when no move is left pending."""
        entries = await self.redis.zrange(moves_key(key_id), 0, -1, withscores=True)
        if not entries:
            return True
        record = await self.keys.get(key_id)
        if record is None:
            await self.redis.delete(moves_key(key_id))
            return True
        finished = True  # still true while every entry so far is done
        for member, epoch in entries:
            source = member.decode().rsplit("|", 1)[0]
            done = await self._sweep_one(key_id, source, int(epoch), record.limits_home)
            if done and finished:
                await self.redis.zrem(moves_key(key_id), member)
            finished = finished and done
        return finished

    async def sweep_pending(self, limit: int = SWEEP_BATCH) -> int:
        """One pass over the keys with moves pending; returns how many are still pending."""
        pending = await self.redis.zrange(MOVES_INDEX_KEY, 0, limit - 1, withscores=True)
        left = 0
        for member, score in pending:
            if await self.sweep_key(member.decode()):
                await self._call(self._unindex, [MOVES_INDEX_KEY], [member, int(score)])
            else:
                left += 1
        return left

    async def run(self, interval_s: float = SWEEP_INTERVAL_S) -> None:
        """The background sweep of one replica (every replica runs one; they never conflict)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.sweep_pending()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: the next pass tries again
                if not isinstance(exc, REDIS_FAILURES):
                    self.log.error("limit_moves_sweep_failed", error=repr(exc))

    async def _sweep_one(self, key_id: str, source: str, epoch: int, home: str) -> bool:
        """Carry ``source``'s counters on, for the move of ``epoch``; True once nothing more
        can come of it."""
        if source == home:
            # The key is back at this home: what is there is its own once the move back opens
            # it (a later entry's first transfer); until then this one waits.
            return await self._is_home_again(key_id, source, epoch)
        source_keys = self._with_out(self.limiter.keys(key_id, source))
        lease_ms = self.limiter.lease_ms
        for _ in range(16):  # a busy key may have new settles each round; finish next time
            reply = await self._call(
                self._out,
                source_keys,
                [epoch, home, self.limiter.window_ms, self.limiter.buckets, lease_ms],
            )
            status = _text(reply[0])
            if status == "home":
                return True
            if status == "empty":
                if int(reply[5]) or int(reply[6]):
                    return False  # requests reserved there still in flight
                cleared = await self._call(self._done, source_keys, [LEFT_STATE_TTL_MS])
                return bool(cleared)
            transfer = _Transfer(_text(reply[1]), _text(reply[2]), int(reply[3]), _text(reply[4]))
            await self._apply(key_id, source, transfer)
            await self._call(self._ack, source_keys, [transfer.seq])
        return False

    async def _apply(self, key_id: str, source: str, transfer: _Transfer) -> None:
        target_keys = self.limiter.keys(key_id, transfer.target)
        args = [
            source,
            transfer.seq,
            transfer.epoch,
            transfer.items,
            self.limiter.window_ms,
            self.limiter.buckets,
        ]
        reply = await self._call(self._in, target_keys, args)
        self.log.debug(
            "limits_moved",
            key_id=key_id,
            source=source,
            target=transfer.target,
            seq=transfer.seq,
            result=_text(reply[0]),
        )

    async def _is_home_again(self, key_id: str, home: str, epoch: int) -> bool:
        state_key = self.limiter.keys(key_id, home)[-1]
        opened = await self.redis.hget(state_key, "epoch")
        return int(opened or 0) >= epoch

    def _with_out(self, scope: list[str]) -> list[str]:
        return [*scope, scope[-1].removesuffix("state") + "out"]

    async def _call(self, script: LuaScript, keys: list[str], args: list[Any]) -> Any:
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        fallback = ("EVAL", script.source, len(keys), *keys, *args)
        return await self._direct.script(command, fallback)


def _text(value: bytes | str | int) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
