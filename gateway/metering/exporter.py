"""The exporter: moves usage events from the Redis buffer into the SQL usage store.

Every replica runs one, beside the requests and never on their path. A round reads up to
``batch`` events from the buffer's shards as a member of the store's consumer group, inserts
them into the store in one transaction (idempotent by event id), then acknowledges and deletes
them from Redis. An entry it cannot store (unreadable, refused by the ledger's checks, or an
event the database refuses; ``gateway.metering.dead_letters``) is kept as a dead letter in the
store first, then acknowledged: never deleted unstored, and never blocking the entries after it. Delivery is at least once: a replica killed between the insert and the
acknowledgement leaves its entries pending, another replica (or itself, restarted) claims them
with ``XAUTOCLAIM`` once idle for ``claim_idle_s`` and inserts them again, which the store
turns into no-ops. A round whose insert or acknowledgement failed keeps its entries and retries
them first, with a growing pause, so a store outage only lets the buffer grow in Redis.

It also keeps the export metrics (lag, backlog, pending; events by outcome), runs the store's
``maintain()`` (partitions ahead, retention) at start and every ``maintain_interval_s``, forgets
consumers of replicas long gone, and sweeps usage left in Redis by an older version
(``gateway.metering.legacy``) at start and whenever an old replica has written since.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from gateway.ledger import UsageStore
from gateway.ledger.dead_letters import DeadLetter
from gateway.metering.buffer import BufferEntry, UsageBuffer
from gateway.metering.dead_letters import Pair, decode_entry, store_apart
from gateway.metering.legacy import LegacyImport
from gateway.metrics import Metrics
from gateway.server.tasks import cancel_until_done
from gateway.settings import ExportSettings
from gateway.store.connect import REDIS_FAILURES

MAX_BACKOFF_S = 10.0
# The longest the exporter's decoding runs before the event loop gets a turn. A request in
# flight needs five or six turns (its read, the reservation, the upstream, the settle, its
# write), and waits for a slice at each of them; an event takes 9-10 µs to read and check.
DECODE_SLICE_S = 0.0001
# A consumer idle this long with nothing pending belongs to a replica that is gone.
FORGET_CONSUMERS_AFTER_S = 3600.0


class ExportFailed(Exception):
    """One round could not finish; ``stage`` is what failed: ``redis`` or ``store``."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        super().__init__(f"{stage}: {type(cause).__name__}: {cause}")
        self.stage = stage
        self.cause = cause


def consumer_name() -> str:
    """Unique per process (a restarted replica is a new consumer; its predecessor's pending
    entries are claimed once idle)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(eq=False)
class UsageExporter:
    buffer: UsageBuffer
    store: UsageStore
    settings: ExportSettings
    metrics: Metrics
    log: Any
    _: KW_ONLY
    legacy: LegacyImport | None = None
    consumer: str = field(default_factory=consumer_name)
    # Read, but not yet in the store and acknowledged.
    _unsent: list[BufferEntry] = field(default_factory=list, init=False)
    # After a read whose reply may have been lost, this consumer's own pending entries are
    # read back first (they are delivered to it, so no other read would return them).
    _own_first: bool = field(default=False, init=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False)
    _count_letters_at: float = field(default=0.0, init=False)

    # -- one round -------------------------------------------------------------------------

    async def export_once(self, *, claim: bool = False) -> int:
        """Move one batch into the store; returns how many buffer entries it handled (0: the
        buffer had nothing for this consumer). Raises ``ExportFailed``; the entries of a failed
        round are retried first by the next."""
        entries = self._unsent
        if not entries:
            entries = await self._take(claim)
            if not entries:
                return 0
            self._unsent = entries
        pairs, letters = await self._decode(entries)
        inserted, refused = 0, list[DeadLetter]()
        if pairs:
            started = time.perf_counter()
            try:
                inserted, refused = await store_apart(self.store, pairs)
            except Exception as exc:  # any driver's error: the entries stay, retried later
                raise ExportFailed("store", exc) from exc
            self.metrics.export_batch.observe(time.perf_counter() - started)
            letters += refused
        if letters:
            try:  # kept before the entries leave Redis: nothing is deleted unstored
                await self.store.keep_dead_letters(letters)
            except Exception as exc:
                raise ExportFailed("store", exc) from exc
        try:
            await self.buffer.acknowledge(entries)
        except Exception as exc:
            raise ExportFailed("redis", exc) from exc
        self._unsent = []
        self._report_letters(letters)
        self.metrics.exported.labels("inserted").inc(inserted)
        self.metrics.exported.labels("duplicate").inc(len(pairs) - len(refused) - inserted)
        self.metrics.exported.labels("rejected").inc(len(letters))
        return len(entries)

    async def _take(self, claim: bool) -> list[BufferEntry]:
        batch = self.settings.batch
        try:
            if self._own_first:
                entries = await self.buffer.read(self.consumer, batch, own=True)
                if entries:
                    return entries
                self._own_first = False
            entries = []
            if claim:
                idle_ms = int(self.settings.claim_idle_s * 1000)
                entries = await self.buffer.claim(self.consumer, idle_ms, batch)
                if entries:
                    self.log.info("usage_export_claimed", count=len(entries))
            if len(entries) < batch:
                entries += await self.buffer.read(self.consumer, batch - len(entries))
            return entries
        except Exception as exc:
            self._own_first = True
            raise ExportFailed("redis", exc) from exc

    async def _decode(self, entries: list[BufferEntry]) -> tuple[list[Pair], list[DeadLetter]]:
        """The events to insert with their payloads, and the dead letters of the entries that
        are not events the store can take.

        Decoded ``DECODE_SLICE_S`` at a time, timed on this machine, the requests in flight
        running in between: a round of a thousand events held the event loop for about 10 ms,
        the p99 of a busy gateway; slices of 32 events (0.3 ms) still added a slice to each
        step of a request that arrived during the round. An entry this process appended is
        not decoded: its event is taken from ``buffer.recent`` and checked against the store's
        bounds."""
        pairs: list[Pair] = []
        letters: list[DeadLetter] = []
        clock = time.perf_counter
        recent = self.buffer.recent
        slice_ends = clock() + DECODE_SLICE_S
        for entry in entries:
            if clock() >= slice_ends:
                await asyncio.sleep(0)
                slice_ends = clock() + DECODE_SLICE_S
            if entry.payload is None:
                continue  # deleted while pending: nothing left but to acknowledge it
            decoded = decode_entry(entry.payload, known=recent.take(entry.payload))
            if isinstance(decoded, DeadLetter):
                letters.append(decoded)
            else:
                pairs.append((decoded, entry.payload))
        return pairs, letters

    def _report_letters(self, letters: list[DeadLetter]) -> None:
        """An error line per new dead letter (an operator must replay it); the metric is
        counted again at the next stats refresh."""
        if not letters:
            return
        self._count_letters_at = 0.0
        for letter in letters:
            self.log.error(
                "usage_export_rejected",
                dead_letter=letter.letter_id,
                event_id=letter.event_id,
                key_id=letter.key_id,
                field=letter.field,
                reason=letter.reason,
            )

    async def drain(self) -> int:
        """Export until the buffer has nothing more for this consumer; returns entries handled."""
        handled = 0
        while count := await self.export_once():
            handled += count
        return handled

    # -- the background task ---------------------------------------------------------------

    async def start(self) -> None:
        if self._tasks:
            return
        self._tasks.append(asyncio.create_task(self._run(), name="usage-export"))
        if self.legacy is not None:
            self._tasks.append(asyncio.create_task(self._sweep_legacy(), name="usage-legacy"))

    async def stop(self) -> None:
        """Stop the rounds, then one last bounded drain (what the settle batch just wrote), and
        leave the group if nothing is pending here."""
        tasks, self._tasks = self._tasks, []
        await cancel_until_done(tasks)
        self._own_first = True  # a round cancelled mid-read may have left entries delivered
        try:
            async with asyncio.timeout(self.settings.stop_timeout_s):
                await self.drain()
                await self.buffer.forget_consumers(self.consumer)
        except (TimeoutError, ExportFailed, *REDIS_FAILURES) as exc:
            self.log.warning("usage_export_stopped_with_backlog", error=type(exc).__name__)

    async def _run(self) -> None:
        settings = self.settings
        await self._maintain()
        now = time.monotonic()
        next_stats = next_claim = now
        next_maintain = now + settings.maintain_interval_s
        failures = 0
        while True:
            now = time.monotonic()
            claim = now >= next_claim
            if claim:
                next_claim = now + max(settings.claim_idle_s / 2, settings.interval_s)
            try:
                handled = await self.export_once(claim=claim)
                failures = 0
            except ExportFailed as exc:
                failures += 1
                handled = 0
                self.metrics.export_errors.labels(exc.stage).inc()
                self.log.warning(
                    "usage_export_failed",
                    stage=exc.stage,
                    error=type(exc.cause).__name__,
                    retry_in_s=self._backoff(failures),
                )
            if now >= next_stats:
                next_stats = now + settings.stats_interval_s
                await self.refresh_stats()
            if now >= next_maintain:
                next_maintain = now + settings.maintain_interval_s
                await self._maintain()
            if failures:
                await asyncio.sleep(self._backoff(failures))
            elif handled < settings.batch:
                await asyncio.sleep(settings.interval_s)  # caught up: poll again later
            else:
                await asyncio.sleep(0)  # a backlog: the next batch at once

    def _backoff(self, failures: int) -> float:
        return min(self.settings.interval_s * 2 ** (failures - 1), MAX_BACKOFF_S)

    async def refresh_stats(self) -> None:
        """Read the buffer's backlog, pending count and lag into the metrics."""
        try:
            stats = await self.buffer.stats()
        except Exception as exc:
            self.log.info("usage_export_stats_unavailable", error=type(exc).__name__)
            return
        self.metrics.export_backlog.set(stats.backlog)
        self.metrics.export_pending.set(stats.pending)
        self.metrics.export_lag.set(stats.lag_s(int(time.time() * 1000)))
        await self.count_dead_letters()

    async def count_dead_letters(self, *, now: float | None = None) -> None:
        """The store's dead letters into the gauge, at most every ``dead_letter_interval_s``
        (and at the first refresh after a new one)."""
        now = time.monotonic() if now is None else now
        if now < self._count_letters_at:
            return
        self._count_letters_at = now + self.settings.dead_letter_interval_s
        try:
            self.metrics.usage_dead_letters.set(await self.store.count_dead_letters())
        except Exception as exc:
            self._count_letters_at = 0.0
            self.log.info("usage_dead_letters_uncounted", error=type(exc).__name__)

    async def _maintain(self) -> None:
        """The store's partitions and retention, and the group's dead consumers; a failure is
        logged and tried again next time."""
        try:
            result = await self.store.maintain()
            if result.days_dropped:
                self.log.info(
                    "usage_store_maintained",
                    cutoff=result.cutoff.isoformat(),
                    days_dropped=len(result.days_dropped),
                )
        except Exception as exc:
            self.log.warning("usage_store_maintain_failed", error=f"{type(exc).__name__}: {exc}")
        idle_ms = int(max(FORGET_CONSUMERS_AFTER_S, 10 * self.settings.claim_idle_s) * 1000)
        with contextlib.suppress(Exception):  # the next round recreates what it needs
            await self.buffer.ensure_groups()
            await self.buffer.forget_consumers(self.consumer, others_idle_ms=idle_ms)

    async def _sweep_legacy(self) -> None:
        """Import old-format usage at start, and again while old replicas keep writing it."""
        assert self.legacy is not None
        due = True
        while True:
            try:
                if due or await self.legacy.pending():
                    due = (await self.legacy.sweep()).found
            except Exception as exc:
                due = True
                self.log.warning("usage_legacy_import_failed", error=type(exc).__name__)
            await asyncio.sleep(self.settings.legacy_interval_s)
