"""The upgrade from usage kept in Redis: old events moved into the SQL store, old keys dropped.

Versions before the SQL store kept, per key (hash tag ``{key:<id>}``): the events in a stream
``sy:{key:<id>}:usage:events`` (400 days), per-day aggregate hashes ``...:usage:day:<YYYYMMDD>``
and one idempotency marker ``...:usage:seen:<request id>`` per request; and two index sets,
``sy:usage:keys`` and ``sy:usage:active:<YYYYMMDD>``. Events may carry ``cost_micros``
(micro-dollars, before nano-dollars) or ``cost_nanos``; ``UsageEvent.from_dict`` reads both.

``LegacyImport.sweep`` finds the old streams with ``SCAN`` (on every master of a cluster), so it
needs no index and misses no stream. Each is read in batches; a batch is inserted into the store
(idempotent by event id), and only then are its entries deleted, with the markers of its events,
in one script in the key's slot (the stream is removed once empty). Only after that pass does a
second ``SCAN`` unlink the aggregates, the remaining markers and the index sets: nothing is
dropped before the events it summarises are in the store. A replica of the old version still
running during a rolling upgrade writes new old-format data; it is picked up by the next sweep
(``pending`` tells the exporter whether one is due). Every replica may sweep at once: inserts
and deletes are idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.ledger import UsageStore
from gateway.ledger.dead_letters import DeadLetter
from gateway.metering.dead_letters import Pair, decode_entry, store_apart
from gateway.store.connect import RedisClient
from gateway.store.scripts import LuaScript, ScriptBatch

KEY_INDEX = "sy:usage:keys"
ACTIVE_PATTERN = "sy:usage:active:*"
PER_KEY_PATTERN = "sy:{key:*}:usage:*"
STREAM_PATTERN = "sy:{key:*}:usage:events"
SCAN_COUNT = 1000

# KEYS: 1 the key's old stream, 2.. markers of the events imported. ARGV: the entry ids.
# Returns the entries left in the stream (the stream is removed when none is).
TRIM_SCRIPT = LuaScript.of(
    """
if #ARGV > 0 then
  redis.call('XDEL', KEYS[1], unpack(ARGV))
end
for i = 2, #KEYS do
  redis.call('UNLINK', KEYS[i])
end
local left = redis.call('XLEN', KEYS[1])
if left == 0 then
  redis.call('UNLINK', KEYS[1])
end
return left
"""
)


def key_prefix(key_id: str) -> str:
    """All of one key's old usage data shared this hash tag, hence one cluster slot."""
    return f"sy:{{key:{key_id}}}:usage"


def stream_key(key_id: str) -> str:
    return f"{key_prefix(key_id)}:events"


def marker_key(key_id: str, request_id: str) -> str:
    return f"{key_prefix(key_id)}:seen:{request_id}"


def key_id_of(stream: str) -> str:
    """``sy:{key:<id>}:usage:events`` -> ``<id>``."""
    return stream[len("sy:{key:") : -len("}:usage:events")]


@dataclass
class SweepResult:
    """What one sweep did: events inserted (new to the store), events skipped (already there,
    or past retention), entries rejected (kept as dead letters, logged), old keys unlinked."""

    inserted: int = 0
    skipped: int = 0
    rejected: int = 0
    unlinked: int = 0
    streams: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return bool(self.streams or self.unlinked or self.rejected)


class LegacyImport:
    """Moves the old per-key usage data of one Redis into one store."""

    def __init__(self, redis: RedisClient, store: UsageStore, log: Any, batch: int = 1000):
        self.redis = redis
        self.store = store
        self.log = log
        self.batch = batch

    async def pending(self) -> bool:
        """Whether a replica of the old version has written since the last sweep (it adds
        every key it records for to the old key index)."""
        return bool(await self.redis.exists(KEY_INDEX))

    async def sweep(self) -> SweepResult:
        result = SweepResult()
        # A set: SCAN may return a key twice.
        streams = {name async for name in self._scan(STREAM_PATTERN, kind="stream")}
        for stream in sorted(streams):
            await self._import_stream(stream, result)
            result.streams.append(stream)
        chunk: list[str] = []
        for pattern in (PER_KEY_PATTERN, ACTIVE_PATTERN):
            async for name in self._scan(pattern):
                if name.endswith(":usage:events"):
                    continue  # a stream written since the first pass: the next sweep's
                chunk.append(name)
                if len(chunk) >= SCAN_COUNT:
                    result.unlinked += await self._unlink(chunk)
                    chunk = []
        result.unlinked += await self._unlink([*chunk, KEY_INDEX])
        if result.found:
            self.log.info(
                "usage_legacy_imported",
                streams=len(result.streams),
                inserted=result.inserted,
                skipped=result.skipped,
                rejected=result.rejected,
                unlinked=result.unlinked,
            )
        return result

    async def _scan(self, pattern: str, kind: str | None = None) -> Any:
        async for name in self.redis.scan_iter(match=pattern, count=SCAN_COUNT, _type=kind):
            yield _text(name)

    async def _import_stream(self, stream: str, result: SweepResult) -> None:
        key_id = key_id_of(stream)
        while True:
            entries = await self.redis.xrange(stream, "-", "+", count=self.batch)
            if not entries:
                await self._trim(stream, [], [])
                return
            pairs: list[Pair] = []
            letters: list[DeadLetter] = []
            markers: list[str] = []
            for _, fields in entries:
                raw = (fields or {}).get(b"e", b"")
                decoded = decode_entry(raw)
                if isinstance(decoded, DeadLetter):
                    letters.append(decoded)
                else:
                    pairs.append((decoded, raw))
                    markers.append(marker_key(key_id, decoded.event_id))
            inserted, refused = await store_apart(self.store, pairs) if pairs else (0, [])
            letters += refused
            if letters:  # kept before the old entries go (gateway.metering.dead_letters)
                await self.store.keep_dead_letters(letters)
            for letter in letters:
                self.log.error(
                    "usage_legacy_event_rejected",
                    stream=stream,
                    dead_letter=letter.letter_id,
                    event_id=letter.event_id,
                    field=letter.field,
                    reason=letter.reason,
                )
            result.rejected += len(letters)
            result.inserted += inserted
            result.skipped += len(pairs) - len(refused) - inserted
            left = await self._trim(stream, [entry_id for entry_id, _ in entries], markers)
            if not left:
                return

    async def _trim(self, stream: str, entry_ids: list[bytes], markers: list[str]) -> int:
        batch = ScriptBatch()
        batch.call(TRIM_SCRIPT, [stream, *markers], entry_ids)
        return (await batch.execute(self.redis))[0]

    async def _unlink(self, names: list[str]) -> int:
        """One UNLINK per key (a cluster routes each to its slot), in one round trip."""
        batch = ScriptBatch()
        for name in names:
            batch.command("UNLINK", name)
        return sum(await batch.execute(self.redis))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
