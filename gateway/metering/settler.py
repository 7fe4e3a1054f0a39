"""Limiter settles and usage records, batched into one Redis pipeline.

Everything submitted in one event-loop turn goes out together, so each request costs at most
one shared round trip. ``submit`` returns a future that resolves once the batch is durable
(recorded in Redis, or fsync'ed to the local spool): the request path awaits it before the
last byte of its response, so a gateway killed with SIGKILL loses only requests still in
flight, never an answered one. If Redis fails, the usage events go to the spool (replayed
later, idempotent by request id) and unsettled reservations keep their estimate until their
lease lapses: nothing is lost because Redis was down.

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
from gateway.metering.ledger import UsageEvent, UsageLedger
from gateway.metering.limits import BudgetCrossing, Limiter, Reservation, settle_crossings
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
        ledger: UsageLedger,
        log: Any,
        alerts: AlertOutbox | None = None,
    ) -> None:
        """``alerts``: where crossed budget thresholds go (None: they are only logged)."""
        self.redis = redis
        self.alerts = alerts
        self._direct = DirectRedis(redis)  # one round trip per batch, without pool machinery
        self.limiter = limiter
        self.ledger = ledger
        self.log = log
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
            settles: list[tuple[int, Reservation]] = []
            for item in batch:
                if item.reservation is not None:
                    at = self.limiter.queue_settle(
                        commands, item.reservation, tokens=item.tokens, cost_nanos=item.cost_nanos
                    )
                    settles.append((at, item.reservation))
                if item.event is not None:
                    self.ledger.queue_record(commands, item.event)
            # Settles go as EVALSHA (a NOSCRIPT reloads and resends them: idempotent), records
            # as XADD.
            replies = await commands.execute(self._direct)
        except Exception as exc:  # not only REDIS_FAILURES: see below
            # Whatever broke the write (redis-py can also fail with a non-Redis error when a
            # cluster connection is torn down mid-send), the events must reach the spool.
            self.log.warning("settle_failed", count=len(batch), error=type(exc).__name__)
            # The records may or may not have landed: a replayed copy is stored once.
            await self.ledger.spool_events(events, reason=exc)
            return []
        return [c for at, held in settles for c in settle_crossings(held, replies[at])]

    async def drain(self, timeout: float = 5.0) -> None:
        self._start_flush()
        if self._flushes:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*self._flushes), timeout)
