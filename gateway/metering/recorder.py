"""The recorder that puts each usage event in the Redis buffer on its way to the store.

One request leaves one ``UsageEvent`` (``gateway.ledger.event``). ``UsageRecorder.queue_record``
adds one ``XADD`` to a caller's ``ScriptBatch`` (the limiter's settle goes into the same one, so both cost one round
trip): the event's JSON is appended to one of the buffer's shard streams
(``gateway.metering.buffer``), from where the exporter moves it into the SQL usage store. Redis
keeps nothing per request once the store has it.

When Redis cannot be reached the event goes to the local spool (``gateway.metering.spool``) and
the call still succeeds; ``replay_spool`` appends it to the buffer later. An event may then be
in the buffer twice (the first append may have landed before the reply was lost); the store
keeps each event id once, so the duplicate counts nothing.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import KW_ONLY, dataclass, field

import structlog

from gateway.ledger import UsageError, UsageEvent
from gateway.metering.buffer import UsageBuffer
from gateway.metering.replay_loop import ReplayLoop
from gateway.metering.spool import Segment, Spool
from gateway.store.connect import REDIS_FAILURES
from gateway.store.scripts import ScriptBatch

log = structlog.get_logger(__name__)


class RecordOutcome(enum.StrEnum):
    RECORDED = "recorded"  # in the Redis buffer
    SPOOLED = "spooled"
    LOST = "lost"  # Redis and the spool both failed; the event is in the error log only


@dataclass(eq=False)
class UsageRecorder:
    """Records usage events in the Redis buffer; falls back to a local spool when Redis is
    unreachable, and replays the spool into the buffer once it answers again."""

    buffer: UsageBuffer
    _: KW_ONLY
    spool: Spool
    replay_interval_s: float = 5.0
    replay_batch: int = 200
    _replay_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    _replays: ReplayLoop = field(init=False)

    def __post_init__(self) -> None:
        self._replays = ReplayLoop(
            "usage", self.spool, self.replay_spool, interval_s=self.replay_interval_s, log=log
        )

    def queue_record(self, batch: ScriptBatch, event: UsageEvent) -> int:
        """Queue the record (one ``XADD`` to the event's buffer shard) on ``batch``; returns
        the position of its reply. Other commands (the limiter's settle) may share the batch."""
        return self.buffer.queue_append(batch, event.event_id, event.to_json(), event)

    async def record(self, event: UsageEvent) -> RecordOutcome:
        """Record one event in its own round trip (spooled if Redis fails)."""
        batch = ScriptBatch()
        self.queue_record(batch, event)
        try:
            await batch.execute(self.buffer.redis)
        except REDIS_FAILURES as exc:
            return await self.spool_event(event, reason=exc)
        return RecordOutcome.RECORDED

    async def spool_event(
        self, event: UsageEvent, *, reason: BaseException | None = None
    ) -> RecordOutcome:
        """Append to the spool; if even the disk fails, log the whole event as the last resort
        (the response was already served, so raising would help nobody)."""
        try:
            await self.spool.append(event.to_json())
        except OSError as exc:
            log.error("usage_lost", usage_event=event.to_json().decode(), reason=str(exc))
            return RecordOutcome.LOST
        log.warning(
            "usage_spooled",
            request_id=event.event_id,
            key_id=event.key_id,
            reason=type(reason).__name__ if reason else None,
        )
        return RecordOutcome.SPOOLED

    async def spool_events(
        self, events: list[UsageEvent], *, reason: BaseException | None = None
    ) -> RecordOutcome:
        """Spool a batch with one fsync; on a disk failure log every event (as ``spool_event``)."""
        if not events:
            return RecordOutcome.SPOOLED
        try:
            await self.spool.append_many([event.to_json() for event in events])
        except OSError as exc:
            for event in events:
                log.error("usage_lost", usage_event=event.to_json().decode(), reason=str(exc))
            return RecordOutcome.LOST
        log.warning(
            "usage_spooled",
            count=len(events),
            request_ids=[event.event_id for event in events[:20]],
            reason=type(reason).__name__ if reason else None,
        )
        return RecordOutcome.SPOOLED

    def spool_depth(self) -> int:
        """Events waiting in the spool (for metrics)."""
        return self.spool.depth()

    async def replay_spool(self) -> int:
        """Append spooled events to the buffer in order; returns how many were appended.

        Each spool segment is removed only after all its events were accepted by Redis. If the
        replay is cut short, the next one starts the segment again: the events appended twice
        are stored once (the store keeps each event id once). Raises ``RedisError`` when Redis
        is still away.
        """
        async with self._replay_lock:
            appended = 0
            async with self.spool.replaying() as segments:
                for segment in segments:
                    events = self._parse_segment(segment)
                    for start in range(0, len(events), self.replay_batch):
                        batch = ScriptBatch()
                        for event in events[start : start + self.replay_batch]:
                            self.queue_record(batch, event)
                        await batch.execute(self.buffer.redis)
                        appended += len(batch)
                    segment.done()
            if appended:
                log.info("usage_spool_replayed", appended=appended)
            return appended

    def _parse_segment(self, segment: Segment) -> list[UsageEvent]:
        events = []
        for line in segment.lines():
            try:
                events.append(UsageEvent.from_json(line))
            except UsageError as exc:
                # A torn last line after a crash, or a hand-edited file: keep it, don't loop on it.
                self.spool.reject(line)
                log.error("usage_spool_line_rejected", path=str(segment.path), reason=str(exc))
        return events

    async def start(self) -> None:
        """Start the background task that retries the spool every ``replay_interval_s``."""
        await self._replays.start()

    async def stop(self) -> None:
        await self._replays.stop()
