"""Usage events, and the ledger that puts each one in the Redis buffer on its way to the store.

One request leaves one ``UsageEvent``. ``UsageLedger.queue_record`` adds one ``XADD`` to a
caller's ``ScriptBatch`` (the limiter's settle goes into the same one, so both cost one round
trip): the event's JSON is appended to one of the buffer's shard streams
(``gateway.metering.buffer``), from where the exporter moves it into the SQL usage store. Redis
keeps nothing per request once the store has it.

Money is integer nano-dollars (``cost_nanos``). Events written before that unit (in an old
spool line, or the streams of an older version) carry ``cost_micros``: ``UsageEvent.from_dict``
reads them x1000, so old and new data add up exactly.

When Redis cannot be reached the event goes to the local spool (``gateway.metering.spool``) and
the call still succeeds; ``replay_spool`` appends it to the buffer later. An event may then be
in the buffer twice (the first append may have landed before the reply was lost); the store
keeps each event id once, so the duplicate counts nothing.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, date, datetime
from typing import Any

import structlog

from gateway.ledger import LedgerEvent
from gateway.ledger.record import (
    MAX_ID_LENGTH,
    JsonRecord,
    RecordError,
    build_strictly,
    check_id,
    check_outcome,
)
from gateway.metering.buffer import UsageBuffer
from gateway.metering.spool import Segment, Spool
from gateway.money import NANOS_PER_MICRO, nanos_to_usd
from gateway.server.tasks import cancel_until_done
from gateway.store.connect import REDIS_FAILURES
from gateway.store.scripts import ScriptBatch

log = structlog.get_logger(__name__)


class UsageError(RecordError):
    """An event that cannot be recorded; ``field`` names the offending attribute."""


def day_of(epoch_s: float) -> date:
    return datetime.fromtimestamp(epoch_s, UTC).date()


def _check_count(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(field, "must be a non-negative integer")


@dataclass(frozen=True, slots=True)
class UsageEvent(JsonRecord):
    """One request's usage. ``cost_nanos`` (nano-dollars) is exact and authoritative;
    ``cost_usd`` is its float rendering, always derived from it."""

    error = UsageError

    time: float
    request_id: str
    key_id: str
    model: str
    provider: str
    team: str = ""
    task: str = ""
    route: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_nanos: int = 0
    cost_usd: float = 0.0
    # Of prompt_tokens, those written to a provider's prompt cache (Anthropic), priced apart.
    cache_write_tokens: int = 0
    policy_version: str = ""
    latency_ms: int = 0
    ttft_ms: int | None = None
    status: int = 200
    streamed: bool = False
    usage_source: str = "provider"
    attempts: int = 1
    # Attribution (gateway/metering/attribution.py): the end user and the request's tags.
    end_user: str = ""
    tags: tuple[str, ...] = ()
    # The price catalogue its cost came from ("genai-prices 0.2.3"); "" = the policy's price.
    price_catalogue: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.time, bool) or not isinstance(self.time, int | float):
            raise UsageError("time", "must be epoch seconds")
        if not 0 < self.time < 1e11:
            raise UsageError("time", "out of range")
        check_id(UsageError, "request_id", self.request_id)
        check_id(UsageError, "key_id", self.key_id)
        for name in (
            "model",
            "provider",
            "team",
            "task",
            "route",
            "policy_version",
            "end_user",
            "price_catalogue",
        ):
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) > MAX_ID_LENGTH:
                raise UsageError(name, f"must be a string of at most {MAX_ID_LENGTH} characters")
        for name in (
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "cache_write_tokens",
            "latency_ms",
        ):
            _check_count(name, getattr(self, name))
        if self.ttft_ms is not None:
            _check_count("ttft_ms", self.ttft_ms)
        if self.cached_tokens > self.prompt_tokens:
            raise UsageError("cached_tokens", "exceeds prompt_tokens")
        if self.cached_tokens + self.cache_write_tokens > self.prompt_tokens:
            raise UsageError("cache_write_tokens", "with cached_tokens, exceeds prompt_tokens")
        check_outcome(UsageError, self.status, self.streamed, self.usage_source)
        _check_count("attempts", self.attempts)
        if isinstance(self.tags, list):  # JSON gives lists; the record stays immutable
            object.__setattr__(self, "tags", tuple(self.tags))
        if not isinstance(self.tags, tuple) or not all(isinstance(t, str) for t in self.tags):
            raise UsageError("tags", "must be a list of strings")
        _check_count("cost_nanos", self.cost_nanos)
        if self.cost_nanos >= 2**63:
            raise UsageError("cost_nanos", "exceeds a 64-bit Redis counter")
        if self.cost_usd and self.cost_usd != nanos_to_usd(self.cost_nanos):
            raise UsageError("cost_usd", "is a rendering of cost_nanos: set cost_nanos instead")
        object.__setattr__(self, "cost_usd", nanos_to_usd(self.cost_nanos))

    @property
    def day(self) -> date:
        return day_of(self.time)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UsageEvent:
        return build_strictly(cls, upgrade_event_dict(data))

    def to_ledger(self) -> LedgerEvent:
        """The event as the SQL store keeps it (raises ``LedgerError`` naming a field the store
        refuses). The time becomes whole milliseconds the same way for every copy of an event,
        so a re-delivered copy meets the first one on the same day."""
        return LedgerEvent(
            event_id=self.request_id,
            time_ms=int(self.time * 1000),
            key_id=self.key_id,
            model=self.model,
            provider=self.provider,
            team=self.team,
            task=self.task,
            route=self.route,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            cache_write_tokens=self.cache_write_tokens,
            cost_nanos=self.cost_nanos,
            status=self.status,
            streamed=self.streamed,
            usage_source=self.usage_source,
            attempts=self.attempts,
            latency_ms=self.latency_ms,
            ttft_ms=self.ttft_ms,
            policy_version=self.policy_version,
            end_user=self.end_user,
            tags=self.tags,
            price_catalogue=self.price_catalogue,
        )


def upgrade_event_dict(data: dict[str, Any]) -> dict[str, Any]:
    """An event as recorded by any version, in today's fields: ``cost_micros`` (events and spool
    lines from before nano-dollars) becomes ``cost_nanos``; ``cost_usd`` is re-derived."""
    if "cost_micros" not in data and "cost_usd" not in data:
        return data
    data = dict(data)
    micros = data.pop("cost_micros", None)
    data.pop("cost_usd", None)
    if "cost_nanos" not in data and micros is not None:
        _check_count("cost_micros", micros)
        data["cost_nanos"] = micros * NANOS_PER_MICRO
    return data


class RecordOutcome(enum.StrEnum):
    RECORDED = "recorded"  # in the Redis buffer
    SPOOLED = "spooled"
    LOST = "lost"  # Redis and the spool both failed; the event is in the error log only


@dataclass(eq=False)
class UsageLedger:
    """Records usage events in the Redis buffer; falls back to a local spool when Redis is
    unreachable, and replays the spool into the buffer once it answers again."""

    buffer: UsageBuffer
    _: KW_ONLY
    spool: Spool
    replay_interval_s: float = 5.0
    replay_batch: int = 200
    _replay_task: asyncio.Task[None] | None = field(default=None, init=False)
    _replay_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)

    def queue_record(self, batch: ScriptBatch, event: UsageEvent) -> int:
        """Queue the record (one ``XADD`` to the event's buffer shard) on ``batch``; returns
        the position of its reply. Other commands (the limiter's settle) may share the batch."""
        return self.buffer.queue_append(batch, event.request_id, event.to_json())

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
            request_id=event.request_id,
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
            request_ids=[event.request_id for event in events[:20]],
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
        if self._replay_task is None:
            self._replay_task = asyncio.create_task(self._replay_forever(), name="usage-replay")

    async def stop(self) -> None:
        task, self._replay_task = self._replay_task, None
        if task is not None:
            await cancel_until_done([task])

    async def _replay_forever(self) -> None:
        while True:
            if self.spool.depth():
                try:
                    await self.replay_spool()
                except REDIS_FAILURES as exc:
                    log.info("usage_replay_deferred", reason=type(exc).__name__)
            await asyncio.sleep(self.replay_interval_s)
