"""Limiter settles and usage records, batched into one Redis pipeline.

Everything submitted in one event-loop turn goes out together, so each request costs at most
one shared round trip. ``submit`` returns a future that resolves once the batch is durable
(recorded in Redis, or fsync'ed to the local spool): the request path awaits it before the
last byte of its response, so a gateway killed with SIGKILL loses only requests still in
flight, never an answered one. If Redis fails, the usage events go to the usage spool and the
settles to the settle spool (``gateway/metering/settle_spool.py``), each replayed once Redis
answers, idempotent by request id: nothing is lost because Redis was down, and budgets and
reservations end where the usage store says. Releases that fail (a request no provider took,
during an outage) are spooled the same way.

A settle that crosses a budget's alert threshold says so in its reply; once the batch's futures
are resolved (the requests are not kept waiting for it), the crossings are logged
(``budget_alert``) and, with a webhook configured, appended to the alert outbox
(``gateway/alerts``), still inside the flush task, so a drain at shutdown waits for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from gateway.alerts.outbox import Alert, AlertOutbox
from gateway.ledger import UsageEvent
from gateway.metering.limits import (
    BudgetCrossing,
    Limiter,
    Reservation,
    settle_crossings,
    settles_crossings,
)
from gateway.metering.recorder import UsageRecorder
from gateway.metering.replay_loop import ReplayLoop
from gateway.metering.settle_spool import SettleLineError, SpooledSettle
from gateway.metering.spool import Segment, Spool
from gateway.store.direct import DirectRedis
from gateway.store.scripts import ScriptBatch


@dataclass(frozen=True)
class Settlement:
    reservation: Reservation | None
    tokens: int
    cost_nanos: int
    event: UsageEvent | None


class SettleBatcher:
    def __init__(
        self,
        redis: Redis,
        limiter: Limiter,
        recorder: UsageRecorder,
        log: Any,
        alerts: AlertOutbox | None = None,
        *,
        spool: Spool,
        replay_interval_s: float = 5.0,
        replay_batch: int = 200,
    ) -> None:
        """``alerts``: where crossed budget thresholds go (None: they are only logged);
        ``spool``: where settles and releases wait while Redis does not take them, replayed
        every ``replay_interval_s``."""
        self.redis = redis
        self.spool = spool
        self.replay_batch = replay_batch
        self._replay_lock = asyncio.Lock()
        self.alerts = alerts
        self._direct = DirectRedis(redis)  # one round trip per batch, without pool machinery
        self.limiter = limiter
        self.recorder = recorder
        self.log = log
        self._replays = ReplayLoop(
            "settle", spool, self.replay_spool, interval_s=replay_interval_s, log=log
        )
        self._pending: list[tuple[Settlement, asyncio.Future[None]]] = []
        self._flushes: set[asyncio.Task[None]] = set()
        self._scheduled = False

    def submit(self, settlement: Settlement) -> asyncio.Future[None]:
        """Queue one settlement; the future resolves when its batch is recorded or spooled.

        Callers that may be cancelled (a client gone mid-stream) need not await it: the flush
        runs in its own task either way.
        """
        loop = asyncio.get_running_loop()
        durable: asyncio.Future[None] = loop.create_future()
        self._pending.append((settlement, durable))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._start_flush)
        return durable

    def _start_flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._flush(batch))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _flush(self, pending: list[tuple[Settlement, asyncio.Future[None]]]) -> None:
        crossings: list[BudgetCrossing] = []
        try:
            crossings = await self._write([settlement for settlement, _ in pending])
        finally:
            for _, durable in pending:
                if not durable.done():
                    durable.set_result(None)
        if crossings:
            await self._raise_alerts(crossings)

    async def _raise_alerts(self, crossings: list[BudgetCrossing]) -> None:
        now_ms = int(time.time() * 1000)
        alerts = [
            Alert.crossed(
                scope=c.scope,
                scope_id=c.scope_id,
                period=c.period,
                window=c.window,
                threshold=c.threshold,
                spent_nanos=c.spent_nanos,
                budget_nanos=c.budget_nanos,
                at_ms=now_ms,
            )
            for c in crossings
        ]
        for alert in alerts:
            self.log.info("budget_alert", **alert.payload())
        if self.alerts is None:
            return
        try:
            await self.alerts.enqueue(alerts)
        except Exception as exc:  # Redis gone between the settle and now: the log keeps them
            self.log.error(
                "alert_enqueue_failed", error=type(exc).__name__, alerts=[a.id for a in alerts]
            )

    async def _write(self, batch: list[Settlement]) -> list[BudgetCrossing]:
        """Settle and record the batch; returns the alert thresholds its settles crossed."""
        events = [item.event for item in batch if item.event is not None]
        try:
            commands = ScriptBatch()
            # One script run per key settles all its reservations of the batch, as EVALSHA (a
            # NOSCRIPT reloads and resends it: idempotent); records go as XADD.
            settles = self.limiter.queue_settles(
                commands,
                [
                    (item.reservation, item.tokens, item.cost_nanos)
                    for item in batch
                    if item.reservation is not None
                ],
            )
            for event in events:
                self.recorder.queue_record(commands, event)
            replies = await commands.execute(self._direct)
        except Exception as exc:  # not only REDIS_FAILURES: see below
            # Whatever broke the write (redis-py can also fail with a non-Redis error when a
            # cluster connection is torn down mid-send), the events must reach the spool.
            self.log.warning("settle_failed", count=len(batch), error=type(exc).__name__)
            # The records and settles may or may not have landed: a replayed copy of either
            # counts once.
            held = [
                SpooledSettle("settle", item.reservation, item.tokens, item.cost_nanos)
                for item in batch
                if item.reservation is not None
            ]
            await asyncio.gather(self.recorder.spool_events(events, reason=exc), self.retry(held))
            return []
        return [c for at, held in settles for c in settles_crossings(held, replies[at])]

    # -- the settle spool ------------------------------------------------------------------

    async def retry(self, settles: list[SpooledSettle]) -> None:
        """Keep settles or releases that Redis did not take on disk (one fsync) for the replay.
        If even the disk fails they are logged: their holds then lapse with their lease."""
        if not settles:
            return
        try:
            await self.spool.append_many([settle.to_json() for settle in settles])
        except OSError as exc:
            for settle in settles:
                self.log.error("settle_lost", settle=settle.to_json().decode(), reason=str(exc))
            return
        self.log.warning(
            "settle_spooled",
            count=len(settles),
            request_ids=[s.reservation.request_id for s in settles[:20]],
        )

    async def release_later(self, reservation: Reservation) -> None:
        """A release that Redis did not take (the request never reached a provider)."""
        await self.retry([SpooledSettle("release", reservation)])

    def spool_depth(self) -> int:
        """Settles and releases waiting on disk (for metrics)."""
        return self.spool.depth()

    async def replay_spool(self) -> int:
        """Apply the spooled settles and releases in order; returns how many were sent.

        A segment is removed once all its lines were applied; a replay cut short starts it
        again, which is safe (every line is idempotent by request id). Raises the Redis error
        when Redis is still away."""
        async with self._replay_lock:
            sent = 0
            crossings: list[BudgetCrossing] = []
            async with self.spool.replaying() as segments:
                for segment in segments:
                    settles = self._parse_segment(segment)
                    for start in range(0, len(settles), self.replay_batch):
                        chunk = settles[start : start + self.replay_batch]
                        commands = ScriptBatch()
                        at = [self._queue(commands, settle) for settle in chunk]
                        replies = await commands.execute(self._direct)
                        for position, settle in zip(at, chunk, strict=True):
                            crossings += settle_crossings(settle.reservation, replies[position])
                        sent += len(chunk)
                    segment.done()
            if sent:
                self.log.info("settle_spool_replayed", sent=sent)
            if crossings:
                await self._raise_alerts(crossings)
            return sent

    def _queue(self, commands: ScriptBatch, settle: SpooledSettle) -> int:
        if settle.mode == "release":
            return self.limiter.queue_release(commands, settle.reservation)
        return self.limiter.queue_settle(
            commands, settle.reservation, tokens=settle.tokens, cost_nanos=settle.cost_nanos
        )

    def _parse_segment(self, segment: Segment) -> list[SpooledSettle]:
        settles = []
        for line in segment.lines():
            try:
                settles.append(SpooledSettle.from_json(line))
            except SettleLineError as exc:  # a torn last line: keep it for a human
                self.spool.reject(line)
                self.log.error(
                    "settle_spool_line_rejected", path=str(segment.path), reason=str(exc)
                )
        return settles

    async def start(self) -> None:
        """Start the task that replays the settle spool every ``replay_interval_s``."""
        await self._replays.start()

    async def stop(self) -> None:
        await self._replays.stop()

    async def drain(self, timeout: float = 5.0) -> None:
        self._start_flush()
        if self._flushes:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*self._flushes), timeout)
