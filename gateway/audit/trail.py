"""``AuditTrail``: record admin actions durably before answering, and read them back.

Admin actions are rare (a handful a minute at the busiest), so ``record`` writes each entry
synchronously: the admin's answer waits for the SQL commit (a few ms), and an entry the client
was told about is never lost to a crash. A store that fails or takes longer than
``write_timeout_s`` does not hold the admin up: the entry goes to a local spool instead (one
fsync'ed line under ``DATA_DIR/audit-spool``), and a background task feeds the spool back every
few seconds. Entries are idempotent by id, so an entry that reached the store and the spool
both (a write that timed out but committed) is stored once. If the disk fails too, the entry is
logged whole (``audit_entry_lost``), the last resort.

The trail also applies retention once a day: entries are kept as long as usage
(``SWITCHYARD_USAGE_RETENTION_DAYS``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal, TypedDict

import orjson

from gateway.access.admins import Actor, Role
from gateway.audit.scrub import audit_json
from gateway.errors import ServiceUnavailable
from gateway.ledger.audit import (
    AuditEntry,
    AuditPage,
    AuditQuery,
    AuditStore,
    now_ms,
)
from gateway.ledger.backends import open_audit_store
from gateway.ledger.ids import time_ordered_id
from gateway.metering.spool import Spool
from gateway.server.tasks import cancel_until_done
from gateway.settings import Settings, UsageStoreSettings

REPLAY_INTERVAL_S = 5.0
RETENTION_INTERVAL_S = 24 * 3600.0
SPOOL_DIR = "audit-spool"


class AuditEntryView(TypedDict):
    """An audit entry as the API shows it: the before and after values as JSON, not text."""

    object: Literal["audit_entry"]
    event_id: str
    time_ms: int
    actor_kind: Literal["bootstrap", "token", "cli"]
    actor_id: str
    actor_name: str
    actor_role: Role
    action: str
    target: str
    client: str
    request_id: str
    before: Any
    after: Any


def _json_or_none(text: str | None) -> Any:
    return orjson.loads(text) if text is not None else None


def entry_view(entry: AuditEntry) -> AuditEntryView:
    return AuditEntryView(
        object="audit_entry",
        event_id=entry.event_id,
        time_ms=entry.time_ms,
        actor_kind=entry.actor_kind,  # type: ignore[typeddict-item]
        actor_id=entry.actor_id,
        actor_name=entry.actor_name,
        actor_role=entry.actor_role,  # type: ignore[typeddict-item]
        action=entry.action,
        target=entry.target,
        client=entry.client,
        request_id=entry.request_id,
        before=_json_or_none(entry.before_json),
        after=_json_or_none(entry.after_json),
    )


class AuditTrail:
    """The admin audit log: kept in the usage store's database, for its retention; an entry the
    store does not take within ``write_timeout_s`` is spooled under ``data_dir`` instead."""

    def __init__(
        self, store: UsageStoreSettings, data_dir: Path, log: Any, *, write_timeout_s: float = 2.0
    ) -> None:
        self.store_settings = store
        self.data_dir = data_dir
        self.write_timeout_s = write_timeout_s
        self.log = log
        self.spool = Spool(data_dir / SPOOL_DIR)
        self.store: AuditStore | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the store; a store that cannot open now is retried in the background (admin
        actions are spooled meanwhile), the gateway serves either way."""
        await self.open_store()
        self._task = asyncio.create_task(self._maintain())

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_until_done([self._task])
        if self.store is not None:
            await self.store.close()
            self.store = None

    async def record(
        self,
        actor: Actor,
        action: str,
        target: str,
        *,
        client: str,
        request_id: str = "",
        before: Any = None,
        after: Any = None,
    ) -> AuditEntry:
        """Record one admin action (durable when this returns: stored, or spooled)."""
        entry = AuditEntry(
            event_id=time_ordered_id(),
            time_ms=now_ms(),
            actor_kind=actor.kind,
            actor_id=actor.id,
            actor_name=actor.name,
            actor_role=actor.role,
            action=action,
            target=target,
            client=client[:200],
            request_id=request_id[:200],
            before_json=audit_json(before),
            after_json=audit_json(after),
        )
        if self.store is not None:
            try:
                await asyncio.wait_for(self.store.insert([entry]), timeout=self.write_timeout_s)
                return entry
            except Exception as exc:  # the store is down or slow: the spool takes it
                self.log.warning("audit_store_write_failed", error=type(exc).__name__)
        await self._spool(entry)
        return entry

    async def query(self, query: AuditQuery) -> AuditPage:
        if self.store is None:
            raise ServiceUnavailable(
                "The audit log's store is unavailable right now.", code="audit_unavailable"
            )
        return await self.store.query(query)

    async def replay(self) -> int:
        """Feed spooled entries to the store; returns how many were new."""
        if self.store is None:
            return 0
        stored = 0
        async with self.spool.replaying() as segments:
            for segment in segments:
                entries = []
                for line in segment.lines():
                    try:
                        entries.append(AuditEntry(**orjson.loads(line)))
                    except (orjson.JSONDecodeError, TypeError):
                        self.spool.reject(line)
                stored += await self.store.insert(entries)
                segment.done()
        if stored:
            self.log.info("audit_spool_replayed", stored=stored)
        return stored

    async def _spool(self, entry: AuditEntry) -> None:
        line = orjson.dumps(entry.view())
        try:
            await self.spool.append(line)
            self.log.warning("audit_entry_spooled", event_id=entry.event_id, action=entry.action)
        except OSError as exc:
            self.log.error("audit_entry_lost", error=str(exc), entry=entry.view())

    async def open_store(self) -> None:
        try:
            self.store = await open_audit_store(
                self.store_settings.url,
                data_dir=self.data_dir,
                retention_days=self.store_settings.retention_days,
            )
        except Exception as exc:
            self.log.error("audit_store_unavailable", error=str(exc)[:500])

    async def _maintain(self) -> None:
        """Reopen a store that was away, replay the spool, apply retention once a day."""
        loop = asyncio.get_running_loop()
        next_retention = loop.time()
        while True:
            try:
                if self.store is None:
                    await self.open_store()
                await self.replay()
                if self.store is not None and loop.time() >= next_retention:
                    removed = await self.store.apply_retention()
                    next_retention = loop.time() + RETENTION_INTERVAL_S
                    if removed:
                        self.log.info("audit_retention", removed=removed)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store failed mid-way: the next round tries again
                self.log.warning("audit_maintenance_failed", error=type(exc).__name__)
            await asyncio.sleep(REPLAY_INTERVAL_S)


@contextlib.asynccontextmanager
async def audit_trail(settings: Settings, log: Any) -> AsyncIterator[AuditTrail]:
    """A trail for one CLI command: opened, spool replayed, closed at the end."""
    trail = AuditTrail(settings.usage_store, settings.data_dir, log)
    await trail.open_store()
    with contextlib.suppress(Exception):
        await trail.replay()
    try:
        yield trail
    finally:
        if trail.store is not None:
            await trail.store.close()
