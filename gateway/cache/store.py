"""The response cache in Redis: look up, store, count, and purge by model or team.

Keys (``sy`` is the prefix; ``<scope>`` is ``CacheScope.id``, a hash of namespace and model):

```
sy:{cache:<scope>}:e:<hash>   string  one entry (entry.py's bytes), PX = the policy's ttl_s
sy:{cache:<scope>}:index      zset    entry hash -> expiry (ms): purge and stats without SCAN
sy:{cache:<scope>}:meta       hash    namespace, model, purge epoch, counters (stats.py)
sy:cache:scopes               set     every scope seen ([namespace, model] JSON)
```

A scope's keys share the hash tag ``{cache:<scope>}``: every script touches one Cluster slot.
The lookup is one script (``GET`` + count + epoch): one round trip before the upstream call.
Storing happens after the answer went out (one round trip; a second one only to delete
entries pushed past ``max_entries``). Bypasses and skips are counted in process and written
once a second in one batch, so a request the cache does not serve costs no Redis call. A purge moves the scope's epoch on first, so an answer
recorded before the purge and stored after it is refused, then deletes the indexed entries in
batches. ``sy:cache:scopes`` is pruned of scopes whose stats expired whenever it is read.

Memory: every entry expires after ``ttl_s``; each scope holds at most ``max_entries`` entries of
at most ``max_entry_bytes`` (plus ~150 bytes of key and index each), so the worst case is
scopes x max_entries x max_entry_bytes, where scopes = (teams + team-less keys, or 1 when
shared) x cached models, and no more than the answers stored within one ``ttl_s``.

Redis failures raise ``CacheUnavailable``: the caller serves the request uncached.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from gateway.cache.entry import MAGIC, CacheEntry, CacheEntryError
from gateway.cache.key import CacheScope
from gateway.cache.stats import COUNTERS, NOTE_KINDS, CacheStats, PurgeResult, ScopeStats
from gateway.policy.cache import CachePolicy
from gateway.server.tasks import cancel_until_done
from gateway.store.connect import REDIS_FAILURES, RedisClient
from gateway.store.direct import DirectRedis
from gateway.store.scripts import LuaScript, ScriptBatch

# Stats of a scope outlive its last use by this long (or its TTL, when longer).
STATS_RETENTION_S = 86_400
PURGE_BATCH = 500
# Counts of requests the cache did not serve are written at most this long after the fact.
NOTE_FLUSH_S = 1.0

StoreOutcome = Literal["stored", "too_large", "purged"]


class CacheUnavailable(Exception):
    """Redis did not answer: serve the request uncached."""


@dataclass(frozen=True, slots=True)
class Lookup:
    """``entry``: the stored answer, or None (a miss); ``epoch``: pass it back to ``store``."""

    entry: CacheEntry | None
    epoch: int


def _script(name: str) -> LuaScript:
    package = resources.files("gateway.cache") / "lua"
    return LuaScript.of((package / "cache_common.lua").read_text() + (package / name).read_text())


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ResponseCache:
    """One per app; ``drain()`` at shutdown waits for the scope registrations still running."""

    def __init__(
        self,
        redis: RedisClient,
        *,
        prefix: str = "sy",
        stats_retention_s: int = STATS_RETENTION_S,
    ) -> None:
        self._redis = redis
        self._direct = DirectRedis(redis)
        self._prefix = prefix
        self._retention_ms = stats_retention_s * 1000
        self._lookup_lua = _script("cache_lookup.lua")
        self._store_lua = _script("cache_store.lua")
        self._note_lua = _script("cache_note.lua")
        self._purge_lua = _script("cache_purge.lua")
        self._scopes_key = f"{prefix}:cache:scopes"
        self._background: set[asyncio.Task[Any]] = set()
        self._notes: dict[tuple[CacheScope, str], int] = {}
        self._note_keep: dict[CacheScope, int] = {}
        self._note_flush: asyncio.Task[None] | None = None

    # Key names ----------------------------------------------------------------------------

    def _base(self, scope: CacheScope) -> str:
        return f"{self._prefix}:{{cache:{scope.id}}}:"

    def entry_key(self, scope: CacheScope, key: str) -> str:
        return f"{self._base(scope)}e:{key}"

    def _keep_ms(self, policy: CachePolicy | None) -> int:
        ttl_ms = policy.ttl_s * 1000 if policy is not None else 0
        return max(self._retention_ms, ttl_ms)

    # The request path ---------------------------------------------------------------------

    async def lookup(
        self,
        scope: CacheScope,
        key: str,
        policy: CachePolicy,
        *,
        max_age_s: int | None = None,
    ) -> Lookup:
        """The live entry for ``key`` (one round trip); counts a hit or a miss."""
        base = self._base(scope)
        keys = (f"{base}e:{key}", f"{base}meta")
        args = (
            MAGIC,
            -1 if max_age_s is None else max_age_s * 1000,
            _now_ms(),
            self._keep_ms(policy),
            scope.namespace,
            scope.model,
        )
        script = self._lookup_lua
        try:
            value, epoch, registered = await self._direct.script(
                ("EVALSHA", script.sha, 2, *keys, *args), ("EVAL", script.source, 2, *keys, *args)
            )
        except REDIS_FAILURES as exc:
            raise CacheUnavailable(str(exc)) from exc
        if registered:
            self._spawn(self._register(scope))
        entry = None
        if value is not None:
            with contextlib.suppress(CacheEntryError):  # the script checked the version already
                entry = CacheEntry.decode(value)
        return Lookup(entry, int(epoch))

    async def store(
        self, scope: CacheScope, key: str, entry: CacheEntry, policy: CachePolicy, *, epoch: int
    ) -> StoreOutcome:
        """Store an answer under ``key`` for ``policy.ttl_s`` unless it is too large or the
        scope was purged since the lookup that returned ``epoch``."""
        value = entry.encode()
        if len(value) > policy.max_entry_bytes:
            self.note(scope, "skip_too_large", policy)
            return "too_large"
        base = self._base(scope)
        batch = ScriptBatch()
        at = batch.call(
            self._store_lua,
            [f"{base}e:{key}", f"{base}index", f"{base}meta"],
            [
                key,
                value,
                policy.ttl_s * 1000,
                epoch,
                self._keep_ms(policy),
                policy.max_entries,
                scope.namespace,
                scope.model,
            ],
        )
        batch.command("SADD", self._scopes_key, scope.member)
        try:
            reply = (await batch.execute(self._direct))[at]
            if int(reply[0]) == 0:
                return "purged"
            dropped = [f"{base}e:{_text(hash_)}" for hash_ in reply[1:]]
            if dropped:  # one slot: one DEL
                await self._direct.call("DEL", *dropped)
        except REDIS_FAILURES as exc:
            raise CacheUnavailable(str(exc)) from exc
        return "stored"

    def store_later(
        self, scope: CacheScope, key: str, entry: CacheEntry, policy: CachePolicy, *, epoch: int
    ) -> None:
        """``store`` beside the request, not on its path: the answer goes out meanwhile; a
        Redis failure only means the answer is not cached (``drain`` waits for it)."""
        self._spawn(self._store_quietly(scope, key, entry, policy, epoch))

    async def _store_quietly(
        self, scope: CacheScope, key: str, entry: CacheEntry, policy: CachePolicy, epoch: int
    ) -> None:
        with contextlib.suppress(CacheUnavailable):
            await self.store(scope, key, entry, policy, epoch=epoch)

    def note(self, scope: CacheScope, kind: str, policy: CachePolicy | None) -> None:
        """Count an outcome that needed no lookup or store (``bypass``, ``skip_*``). Counted in
        this process and written within ``NOTE_FLUSH_S`` by one batch: no Redis call per
        request for requests the cache does not serve."""
        if kind not in NOTE_KINDS:
            raise ValueError(f"unknown cache counter {kind!r}")
        self._notes[(scope, kind)] = self._notes.get((scope, kind), 0) + 1
        self._note_keep[scope] = max(self._note_keep.get(scope, 0), self._keep_ms(policy))
        if self._note_flush is None:
            self._note_flush = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        try:
            await asyncio.sleep(NOTE_FLUSH_S)
        finally:
            self._note_flush = None
        with contextlib.suppress(CacheUnavailable):  # kept for the next flush
            await self.flush_notes()

    async def flush_notes(self) -> None:
        """Write the counts ``note`` buffered (one round trip); on a Redis failure they stay
        buffered (one number per scope and counter) and ``CacheUnavailable`` is raised."""
        if not self._notes:
            return
        notes, self._notes = self._notes, {}
        keeps, self._note_keep = self._note_keep, {}
        batch = ScriptBatch()
        for (scope, kind), count in notes.items():
            batch.call(
                self._note_lua,
                [f"{self._base(scope)}meta"],
                [kind, count, keeps[scope], scope.namespace, scope.model],
            )
        for scope in keeps:
            batch.command("SADD", self._scopes_key, scope.member)
        try:
            await batch.execute(self._direct)
        except REDIS_FAILURES as exc:
            for (scope, kind), count in notes.items():
                self._notes[(scope, kind)] = self._notes.get((scope, kind), 0) + count
                self._note_keep[scope] = max(self._note_keep.get(scope, 0), keeps[scope])
            raise CacheUnavailable(str(exc)) from exc

    # Admin --------------------------------------------------------------------------------

    async def stats(self, *, model: str | None = None, team: str | None = None) -> CacheStats:
        """Counters and live entries of every scope (of ``model`` and/or ``team``)."""
        try:
            await self.flush_notes()  # this replica's buffered counts first
            scopes = await self._scopes(model, team)
            if not scopes:
                return CacheStats()
            now = _now_ms()
            batch = ScriptBatch()
            for scope in scopes:
                base = self._base(scope)
                batch.command("HMGET", f"{base}meta", "model", *COUNTERS)
                batch.command("ZCOUNT", f"{base}index", f"({now}", "+inf")
            replies = await batch.execute(self._direct)
        except REDIS_FAILURES as exc:
            raise CacheUnavailable(str(exc)) from exc
        rows: list[ScopeStats] = []
        gone: list[CacheScope] = []
        for position, scope in enumerate(scopes):
            known, *values = replies[2 * position]
            if known is None:  # its stats expired: every entry is long gone
                gone.append(scope)
                continue
            counters = {name: int(value or 0) for name, value in zip(COUNTERS, values, strict=True)}
            rows.append(
                ScopeStats(scope.namespace, scope.model, replies[2 * position + 1], counters)
            )
        await self._forget(gone)
        rows.sort(key=lambda row: (row.model, row.namespace))
        return CacheStats(rows)

    async def purge(self, *, model: str | None = None, team: str | None = None) -> PurgeResult:
        """Delete every entry of ``model`` and/or ``team`` (both None: every entry)."""
        try:
            scopes = await self._scopes(model, team)
            entries = 0
            for scope in scopes:
                entries += await self._purge_scope(scope)
        except REDIS_FAILURES as exc:
            raise CacheUnavailable(str(exc)) from exc
        return PurgeResult(scopes=len(scopes), entries=entries)

    async def _purge_scope(self, scope: CacheScope) -> int:
        base = self._base(scope)
        index = f"{base}index"
        keys = (index, f"{base}meta")
        args = (self._retention_ms, scope.namespace, scope.model)
        script = self._purge_lua
        size = int(
            await self._direct.script(
                ("EVALSHA", script.sha, 2, *keys, *args), ("EVAL", script.source, 2, *keys, *args)
            )
        )
        deleted = 0
        # Bounded by the size seen at the epoch move: entries stored after it are new answers.
        for _ in range(-(-size // PURGE_BATCH)):
            hashes = await self._direct.call("ZRANGE", index, 0, PURGE_BATCH - 1)
            if not hashes:
                break
            replies = await self._direct.batch(
                [
                    ("DEL", *(f"{base}e:{_text(hash_)}" for hash_ in hashes)),
                    ("ZREM", index, *hashes),
                ]
            )
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            deleted += int(replies[0])
        return deleted

    async def _scopes(self, model: str | None, team: str | None) -> list[CacheScope]:
        members = await self._direct.call("SMEMBERS", self._scopes_key)
        scopes = []
        for member in members:
            try:
                scope = CacheScope.from_member(member)
            except (ValueError, TypeError):
                continue  # not written by this code: ignore it
            if model is not None and scope.model != model:
                continue
            if team is not None and scope.team != team:
                continue
            scopes.append(scope)
        return scopes

    async def _forget(self, scopes: list[CacheScope]) -> None:
        if scopes:
            await self._direct.call("SREM", self._scopes_key, *(s.member for s in scopes))

    # Background ---------------------------------------------------------------------------

    async def _register(self, scope: CacheScope) -> None:
        with contextlib.suppress(*REDIS_FAILURES):  # stats only; the next store registers it
            await self._direct.call("SADD", self._scopes_key, scope.member)

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Write buffered counts now and wait for registrations still running (shutdown)."""
        if self._note_flush is not None:
            await cancel_until_done([self._note_flush])
        with contextlib.suppress(CacheUnavailable):
            await self.flush_notes()
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
