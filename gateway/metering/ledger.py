"""Usage events and the ledger that records them atomically in Redis.

One request leaves one ``UsageEvent``. ``UsageLedger.add_record`` queues a single Lua call on a
caller's pipeline (the limiter's settle goes into the same one, so both cost one round trip).
The script, keyed by hash tag ``{key:<id>}`` so it stays in one cluster slot:

* ``SET NX EX`` an idempotency marker for the request id; a second record of the same id stops
  here and counts nothing;
* appends the event to the key's stream (``XADD MINID ~`` keeps only the retention window);
* ``HINCRBY``s the key's per-day aggregate hash, one group of fields per
  model/provider/task/team (``m:<model>|p:<provider>|t:<task>|team:<team>:<metric>``).

Money is integer nano-dollars (``cost_nanos``, metric ``nano``). Data written before that unit
holds micro-dollars (events with ``cost_micros``, aggregate metric ``cost``): it is read x1000,
never rewritten, so old and new data add up exactly.

Reports find keys through two plain sets written in the same pipeline, before the script:
``sy:usage:keys`` (every key that ever recorded) and ``sy:usage:active:<YYYYMMDD>`` (keys active
that day). Adding to a set twice is harmless, so a failed pipeline never leaves a wrong index.

When Redis cannot be reached the event goes to the local spool (``gateway.metering.spool``) and the call
still succeeds; ``replay_spool`` feeds it back later, and the marker makes replays idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any
from urllib.parse import quote, unquote

import structlog
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from gateway.ledger.record import (
    MAX_ID_LENGTH,
    JsonRecord,
    RecordError,
    build_strictly,
    check_id,
    check_outcome,
)
from gateway.metering.spool import Segment, Spool
from gateway.money import NANOS_PER_MICRO, nanos_to_usd
from gateway.store.connect import REDIS_FAILURES
from gateway.store.scripts import LuaScript, ScriptBatch

log = structlog.get_logger(__name__)

# "nano" is the cost in nano-dollars; "cost" (micro-dollars) is only read, from older data.
METRICS = ("req", "prompt", "completion", "cached", "nano", "err", "lat", "streamed", "est")
KEY_INDEX = "sy:usage:keys"

# KEYS: 1 idempotency marker, 2 event stream, 3 day aggregate hash
# ARGV: 1 marker ttl s, 2 stream min id (ms), 3 event json, 4 day hash expire-at (epoch s),
#       5 field prefix, 6.. metric increments in METRICS order
RECORD_SCRIPT = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  return 0
end
redis.call('XADD', KEYS[2], 'MINID', '~', ARGV[2], '*', 'e', ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[1])
local names = {'req', 'prompt', 'completion', 'cached', 'nano', 'err', 'lat', 'streamed', 'est'}
for i, name in ipairs(names) do
  -- passed on as the integer text: a Lua number (a double) would round past 2^53
  local delta = ARGV[5 + i]
  if delta ~= '0' then
    redis.call('HINCRBY', KEYS[3], ARGV[5] .. ':' .. name, delta)
  end
end
redis.call('EXPIREAT', KEYS[3], ARGV[4])
return 1
"""
RECORD_LUA = LuaScript.of(RECORD_SCRIPT)


class UsageError(RecordError):
    """An event that cannot be recorded; ``field`` names the offending attribute."""


def day_of(epoch_s: float) -> date:
    return datetime.fromtimestamp(epoch_s, UTC).date()


def day_code(day: date) -> str:
    return day.strftime("%Y%m%d")


def key_prefix(key_id: str) -> str:
    """All of one key's usage data shares this hash tag, hence one cluster slot."""
    return f"sy:{{key:{key_id}}}:usage"


def stream_key(key_id: str) -> str:
    return f"{key_prefix(key_id)}:events"


def day_hash_key(key_id: str, day: date) -> str:
    return f"{key_prefix(key_id)}:day:{day_code(day)}"


def marker_key(key_id: str, request_id: str) -> str:
    return f"{key_prefix(key_id)}:seen:{request_id}"


def active_day_key(day: date) -> str:
    return f"sy:usage:active:{day_code(day)}"


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

    def __post_init__(self) -> None:
        if isinstance(self.time, bool) or not isinstance(self.time, int | float):
            raise UsageError("time", "must be epoch seconds")
        if not 0 < self.time < 1e11:
            raise UsageError("time", "out of range")
        check_id(UsageError, "request_id", self.request_id)
        check_id(UsageError, "key_id", self.key_id)
        for name in ("model", "provider", "team", "task", "route", "policy_version"):
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


def group_field(model: str, provider: str, task: str, team: str) -> str:
    """Components are percent-encoded so ``:`` and ``|`` in names (``qwen3:0.6b``) stay safe."""
    return (
        f"m:{quote(model, safe='')}|p:{quote(provider, safe='')}"
        f"|t:{quote(task, safe='')}|team:{quote(team, safe='')}"
    )


@dataclass(frozen=True, slots=True)
class Group:
    model: str
    provider: str
    task: str
    team: str


def parse_group(prefix: str) -> Group:
    """Inverse of ``group_field``."""
    parts = dict(part.split(":", 1) for part in prefix.split("|"))
    return Group(
        model=unquote(parts["m"]),
        provider=unquote(parts["p"]),
        task=unquote(parts["t"]),
        team=unquote(parts["team"]),
    )


def parse_field(field: str) -> tuple[Group, str]:
    """Inverse of ``group_field(...) + ':' + metric``."""
    prefix, metric = field.rsplit(":", 1)
    return parse_group(prefix), metric


class RecordOutcome(enum.StrEnum):
    RECORDED = "recorded"
    DUPLICATE = "duplicate"
    SPOOLED = "spooled"
    LOST = "lost"  # Redis and the spool both failed; the event is in the error log only


class UsageLedger:
    """Records usage events in Redis; falls back to a local spool when Redis is unreachable."""

    def __init__(
        self,
        redis: Redis,
        *,
        spool: Spool,
        retention_days: int = 400,
        replay_interval_s: float = 5.0,
        replay_batch: int = 200,
    ) -> None:
        if retention_days < 1:
            raise ValueError("retention_days must be at least 1")
        self.redis = redis
        self.spool = spool
        self.retention_days = retention_days
        self.replay_interval_s = replay_interval_s
        self.replay_batch = replay_batch
        self._replay_task: asyncio.Task[None] | None = None
        self._replay_lock = asyncio.Lock()
        self._day_cache: tuple[date, int, str, str] | None = None

    @property
    def retention_s(self) -> int:
        return self.retention_days * 86_400

    def add_record(self, pipe: Pipeline, event: UsageEvent) -> int:
        """Queue the record on ``pipe``: three index writes, then the one atomic script.

        Returns the position of the script's reply in the pipeline's replies (1 when counted,
        0 for a duplicate request id); pass it to ``commit``. Other commands (the limiter's
        settle) may be queued before or after. The script goes as EVAL with its source, so a
        pipeline the caller executes survives an empty script cache; ``queue_record`` on a
        ``ScriptBatch`` is the cheaper way.
        """
        index_writes, keys, args = self._record_parts(event)
        for command in index_writes:
            pipe.execute_command(*command)
        pipe.eval(RECORD_LUA.source, len(keys), *keys, *args)
        return len(pipe) - 1  # len() works on plain and cluster pipelines alike

    def queue_record(self, batch: ScriptBatch, event: UsageEvent) -> int:
        """As ``add_record``, on a ``ScriptBatch`` (EVALSHA with NOSCRIPT recovery)."""
        index_writes, keys, args = self._record_parts(event)
        for command in index_writes:
            batch.command(*command)
        return batch.call(RECORD_LUA, keys, args)

    def _day_keys(self, day: date) -> tuple[int, str, str]:
        """End of ``day`` (epoch s), its code and its active-keys set, kept for the day in
        progress: nearly every record falls on it, and strftime is a visible cost per request."""
        cached = self._day_cache
        if cached is None or cached[0] != day:
            end = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()) + 86_400
            cached = self._day_cache = (day, end, day_code(day), active_day_key(day))
        return cached[1], cached[2], cached[3]

    def _record_parts(
        self, event: UsageEvent
    ) -> tuple[tuple[tuple[Any, ...], ...], list[str], list[Any]]:
        """The index writes, then the record script's keys and arguments."""
        day = event.day
        day_end, code, active = self._day_keys(day)
        # A marker must outlive the data it protects, plus a day of clock slack.
        marker_ttl = self.retention_s + 86_400
        min_id_ms = int((time.time() - self.retention_s) * 1000)
        index_writes = (
            ("SADD", KEY_INDEX, event.key_id),
            ("SADD", active, event.key_id),
            ("EXPIREAT", active, day_end + self.retention_s),
        )
        keys = [
            marker_key(event.key_id, event.request_id),
            stream_key(event.key_id),
            f"{key_prefix(event.key_id)}:day:{code}",  # day_hash_key without a strftime
        ]
        args = [
            marker_ttl,
            max(min_id_ms, 0),
            event.to_json(),
            day_end + self.retention_s,
            group_field(event.model, event.provider, event.task, event.team),
            1,
            event.prompt_tokens,
            event.completion_tokens,
            event.cached_tokens,
            event.cost_nanos,
            1 if event.status >= 400 else 0,
            event.latency_ms,
            1 if event.streamed else 0,
            1 if event.usage_source == "estimated" else 0,
        ]
        return index_writes, keys, args

    async def commit(
        self, pipe: Pipeline, event: UsageEvent, reply_index: int
    ) -> tuple[RecordOutcome, list[Any]]:
        """Execute a pipeline that ``add_record`` was called on; spool the event on failure.

        Any ``RedisError`` (connection lost, or another queued command failing) spools the
        event: the script may or may not have run, and the idempotency marker decides on
        replay. Returns the outcome and the pipeline's replies (empty when spooled), so a
        caller that also queued a limiter settle can read its reply.
        """
        try:
            replies = await pipe.execute()
        except REDIS_FAILURES as exc:
            return await self.spool_event(event, reason=exc), []
        outcome = RecordOutcome.RECORDED if replies[reply_index] == 1 else RecordOutcome.DUPLICATE
        return outcome, replies

    async def record(self, event: UsageEvent) -> RecordOutcome:
        """Record one event in its own round trip."""
        batch = ScriptBatch()
        position = self.queue_record(batch, event)
        try:
            replies = await batch.execute(self.redis)
        except REDIS_FAILURES as exc:
            return await self.spool_event(event, reason=exc)
        return RecordOutcome.RECORDED if replies[position] == 1 else RecordOutcome.DUPLICATE

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
        """Feed spooled events back in order; returns how many were newly counted.

        Each spool segment is removed only after all its events were accepted by Redis. If the
        replay is cut short, the next one starts the segment again and the markers turn the
        already-counted events into no-ops. Raises ``RedisError`` when Redis is still away.
        """
        async with self._replay_lock:
            counted = 0
            async with self.spool.replaying() as segments:
                for segment in segments:
                    events = self._parse_segment(segment)
                    for start in range(0, len(events), self.replay_batch):
                        batch = events[start : start + self.replay_batch]
                        commands = ScriptBatch()
                        positions = [self.queue_record(commands, event) for event in batch]
                        replies = await commands.execute(self.redis)
                        counted += sum(1 for position in positions if replies[position] == 1)
                    segment.done()
            if counted:
                log.info("usage_spool_replayed", counted=counted)
            return counted

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
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _replay_forever(self) -> None:
        while True:
            if self.spool.depth():
                try:
                    await self.replay_spool()
                except REDIS_FAILURES as exc:
                    log.info("usage_replay_deferred", reason=type(exc).__name__)
            await asyncio.sleep(self.replay_interval_s)
