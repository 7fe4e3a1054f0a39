"""The Redis buffer of usage events on their way to the SQL store: short, and emptied by export.

An event is one entry (field ``e`` = the event's JSON) of one of ``SHARDS`` streams,
``sy:usage:{<store id>.<n>}:buffer``. Why this layout:

* **One slot per command.** Each shard has its own hash tag, so every command and script here
  touches one key, and the shards spread over the masters of a Redis Cluster (a single stream
  would put every record of every replica on one master). The shard is ``crc32(event id) mod
  SHARDS``: the same event always goes to the same shard.
* **Named after the store.** The store id is made with the store (``UsageStore.store_id``), so
  replicas that share a store share one buffer, and a replica with a store of its own (its own
  SQLite file) has its own: an exporter only ever moves events into the store of the replica
  that recorded them, however many stores share one Redis.

The exporters of one store read the shards as one consumer group (``export``), each under its
own consumer name. ``acknowledge`` runs ``XACK`` and ``XDEL`` in one script per shard, so an
event leaves Redis exactly when the store has it: what remains is what is not exported yet, and
the oldest entry's id says how old the oldest unexported event is. Entries a consumer read but
never acknowledged (its process was killed) are taken over by another with ``XAUTOCLAIM`` once
idle long enough (``claim``).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from gateway.ledger import UsageEvent
from gateway.metering.recent_events import RecentEvents
from gateway.store.connect import RedisClient
from gateway.store.direct import DirectRedis, pipelined_batch
from gateway.store.scripts import LuaScript, ScriptBatch

SHARDS = 16
GROUP = "export"
FIELD = b"e"

# KEYS: 1 shard stream. ARGV: 1 group, 2.. entry ids. Acknowledged and gone in one step, so no
# entry can stay behind acknowledged but never deleted.
ACK_SCRIPT = LuaScript.of(
    """
redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
return redis.call('XDEL', KEYS[1], unpack(ARGV, 2))
"""
)

# KEYS: 1 shard stream. ARGV: 1 group, 2 consumer name, 3 mode: 'self' removes that consumer,
# 'others' every other one idle for at least ARGV[4] ms; only consumers holding no pending
# entry are removed (deleting one that holds some would strand them), checked and removed in
# one step so none can be handed an entry in between.
FORGET_CONSUMERS_SCRIPT = LuaScript.of(
    """
local removed = 0
for _, info in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local fields = {}
  for i = 1, #info, 2 do
    fields[info[i]] = info[i + 1]
  end
  local mine = fields['name'] == ARGV[2]
  local wanted = (ARGV[3] == 'self' and mine)
    or (ARGV[3] == 'others' and not mine and fields['idle'] >= tonumber(ARGV[4]))
  if wanted and fields['pending'] == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], fields['name'])
    removed = removed + 1
  end
end
return removed
"""
)


def buffer_key(store_id: str, shard: int) -> str:
    return f"sy:usage:{{{store_id}.{shard}}}:buffer"


@dataclass(frozen=True, slots=True)
class BufferEntry:
    """One buffered event as read: its shard, entry id and the event's JSON (None: the entry
    was deleted while pending; only acknowledging it is left to do)."""

    shard: int
    entry_id: bytes
    payload: bytes | None


@dataclass(frozen=True, slots=True)
class BufferStats:
    """``backlog``: events in the buffer (none of them in the store yet); ``pending``: those
    read by an exporter and not yet acknowledged; ``oldest_ms``: when the oldest of them was
    buffered (Redis time, epoch ms), None when the buffer is empty."""

    backlog: int
    pending: int
    oldest_ms: int | None

    def lag_s(self, now_ms: int) -> float:
        """Age of the oldest unexported event (0 when there is none)."""
        return 0.0 if self.oldest_ms is None else max(0.0, (now_ms - self.oldest_ms) / 1000)


def _is_nogroup(reply: Any) -> bool:
    return isinstance(reply, ResponseError) and str(reply).startswith("NOGROUP")


class UsageBuffer:
    """The shard streams of one store on one Redis (single node or cluster). ``bind`` names
    them once the store is open; every other method needs that."""

    def __init__(self, redis: RedisClient, shards: int = SHARDS) -> None:
        if shards < 1:
            raise ValueError("shards must be at least 1")
        self.redis = redis
        # Reads skip redis-py's reply parsing on a single node: it built a dict per entry,
        # about 2 µs an event, all on the event loop at once (a cluster keeps redis-py).
        self._direct = DirectRedis(redis)
        self.shards = shards
        self.keys: tuple[str, ...] = ()
        self.store_id = ""
        # What this process appended, so that its exporter need not decode its own JSON.
        self.recent = RecentEvents()

    def bind(self, store_id: str) -> None:
        if not store_id or any(ch in "{}" or ch.isspace() for ch in store_id):
            raise ValueError(f"not a store id: {store_id!r}")
        self.store_id = store_id
        self.keys = tuple(buffer_key(store_id, shard) for shard in range(self.shards))

    def _keys(self) -> tuple[str, ...]:
        if not self.keys:
            raise RuntimeError("the usage buffer is not bound to a store yet")
        return self.keys

    def shard_of(self, event_id: str) -> int:
        return zlib.crc32(event_id.encode()) % self.shards

    def queue_append(
        self, batch: ScriptBatch, event_id: str, payload: bytes, event: UsageEvent | None = None
    ) -> int:
        """Queue the event's ``XADD`` on ``batch``; returns its reply position. ``event``, the
        event ``payload`` is the JSON of, is kept for this process's exporter (``recent``)."""
        key = self._keys()[self.shard_of(event_id)]
        position = batch.command("XADD", key, "*", FIELD, payload)
        if event is not None:
            self.recent.remember(payload, event)
        return position

    async def _run(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """One pipelined round trip; error replies come back in place, not raised."""
        return await pipelined_batch(self.redis, commands)

    async def ensure_groups(self) -> None:
        """Create the consumer group on every shard (and the stream with it), from the first
        entry, so events buffered before any exporter ran are exported too."""
        replies = await self._run(
            [("XGROUP", "CREATE", key, GROUP, "0", "MKSTREAM") for key in self._keys()]
        )
        for reply in replies:
            if isinstance(reply, Exception) and not str(reply).startswith("BUSYGROUP"):
                raise reply

    async def read(self, consumer: str, count: int, *, own: bool = False) -> list[BufferEntry]:
        """Up to about ``count`` entries never delivered to any consumer, from every shard; with
        ``own``, those already delivered to ``consumer`` and not acknowledged (after a read
        whose reply was lost, they are pending under its name with nobody working on them)."""
        per_shard = max(1, -(-count // self.shards))
        start = "0" if own else ">"
        commands = [
            ("XREADGROUP", "GROUP", GROUP, consumer, "COUNT", per_shard, "STREAMS", key, start)
            for key in self._keys()
        ]
        replies = await self._direct.batch(commands)
        if any(_is_nogroup(reply) for reply in replies):
            # Redis lost the groups (flushed, or restarted without persistence): make them again.
            await self.ensure_groups()
            replies = await self._direct.batch(commands)
        entries: list[BufferEntry] = []
        for shard, reply in enumerate(replies):
            if isinstance(reply, Exception):
                raise reply
            # a single node's reply maps stream -> entries; redis-py's (a cluster) is pairs
            streams = reply.items() if isinstance(reply, dict) else reply or ()
            for _, items in streams:
                entries.extend(_entries(shard, items))
        return entries

    async def claim(self, consumer: str, min_idle_ms: int, count: int) -> list[BufferEntry]:
        """Take over up to about ``count`` entries that another consumer (or this one, before a
        restart) read and left unacknowledged for at least ``min_idle_ms``."""
        per_shard = max(1, -(-count // self.shards))
        replies = await self._run(
            [
                ("XAUTOCLAIM", key, GROUP, consumer, min_idle_ms, "0-0", "COUNT", per_shard)
                for key in self._keys()
            ]
        )
        entries: list[BufferEntry] = []
        for shard, reply in enumerate(replies):
            if _is_nogroup(reply):
                continue  # nothing can be pending in a group that does not exist
            if isinstance(reply, Exception):
                raise reply
            entries.extend(_entries(shard, reply[1]))
        return entries

    async def acknowledge(self, entries: Sequence[BufferEntry]) -> int:
        """Acknowledge and delete the entries (one script per shard, one round trip); returns
        how many were still there to delete."""
        by_shard: dict[int, list[bytes]] = {}
        for entry in entries:
            by_shard.setdefault(entry.shard, []).append(entry.entry_id)
        batch = ScriptBatch()
        keys = self._keys()
        for shard, ids in sorted(by_shard.items()):
            batch.call(ACK_SCRIPT, [keys[shard]], [GROUP, *ids])
        return sum(await batch.execute(self.redis))

    async def stats(self) -> BufferStats:
        """Backlog, pending and the oldest entry over all shards (one round trip)."""
        commands: list[tuple[Any, ...]] = []
        for key in self._keys():
            commands += [
                ("XLEN", key),
                ("XRANGE", key, "-", "+", "COUNT", 1),
                ("XPENDING", key, GROUP),
            ]
        replies = await self._run(commands)
        backlog = pending = 0
        oldest: int | None = None
        for index in range(0, len(replies), 3):
            length, first, summary = replies[index : index + 3]
            for reply in (length, first):
                if isinstance(reply, Exception):
                    raise reply
            backlog += length
            if first:
                first_ms = int(first[0][0].split(b"-")[0])
                oldest = first_ms if oldest is None else min(oldest, first_ms)
            if isinstance(summary, dict):
                pending += summary.get("pending", 0)
            elif not _is_nogroup(summary) and isinstance(summary, Exception):
                raise summary
        return BufferStats(backlog, pending, oldest)

    async def forget_consumers(self, consumer: str, *, others_idle_ms: int | None = None) -> int:
        """Remove ``consumer`` (``others_idle_ms`` None) or every other consumer idle that long,
        from every shard's group, where it holds no pending entry; returns how many went."""
        mode, idle = ("self", 0) if others_idle_ms is None else ("others", others_idle_ms)
        batch = ScriptBatch()
        for key in self._keys():
            batch.call(FORGET_CONSUMERS_SCRIPT, [key], [GROUP, consumer, mode, idle])
        try:
            return sum(await batch.execute(self.redis))
        except ResponseError as exc:
            if "NOGROUP" in str(exc) or "no such key" in str(exc):
                return 0
            raise


def _entries(shard: int, items: Sequence[Any]) -> list[BufferEntry]:
    """Stream entries, each (id, fields). A deleted one still pending has no fields (payload
    None); one without the event field comes back empty, so the exporter rejects it rather
    than claiming it forever."""
    return [BufferEntry(shard, entry_id, _payload(fields)) for entry_id, fields in items]


def _payload(fields: Any) -> bytes | None:
    """The event field of an entry's fields: Redis's flat [field, value, ...] as a single node
    is read, or the dict redis-py parses (a cluster, ``XAUTOCLAIM``)."""
    if fields is None:
        return None
    if isinstance(fields, dict):
        return fields.get(FIELD, b"")
    for at in range(0, len(fields) - 1, 2):
        if fields[at] == FIELD:
            return fields[at + 1]
    return b""
