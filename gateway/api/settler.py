"""After the response: limiter settles and usage records, batched into one Redis pipeline.

Everything that finishes in one event-loop turn goes out together, so each request costs at
most one shared round trip after its response. If Redis fails, the usage events go to the
local spool (replayed later, idempotent by request id) and unsettled reservations keep their
estimate until their lease lapses: nothing is lost because Redis was down.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.limits import Limiter, Reservation
from gateway.usage import UsageEvent, UsageLedger


@dataclass(frozen=True)
class Settlement:
    reservation: Reservation | None
    tokens: int
    cost_usd: float
    event: UsageEvent | None


class SettleBatcher:
    def __init__(self, redis: Redis, limiter: Limiter, ledger: UsageLedger, log: Any) -> None:
        self.redis = redis
        self.limiter = limiter
        self.ledger = ledger
        self.log = log
        self._pending: list[Settlement] = []
        self._flushes: set[asyncio.Task[None]] = set()
        self._scheduled = False

    def submit(self, settlement: Settlement) -> None:
        self._pending.append(settlement)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._start_flush)

    def _start_flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._flush(batch))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _flush(self, batch: list[Settlement]) -> None:
        events = [item.event for item in batch if item.event is not None]
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for item in batch:
                    if item.reservation is not None:
                        self.limiter.add_settle(
                            pipe, item.reservation, tokens=item.tokens, cost_usd=item.cost_usd
                        )
                    if item.event is not None:
                        self.ledger.add_record(pipe, item.event)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            self.log.warning("settle_failed", count=len(batch), error=type(exc).__name__)
            for event in events:  # the record script may or may not have run: markers decide
                await self.ledger.spool_event(event, reason=exc)

    async def drain(self, timeout: float = 5.0) -> None:
        self._start_flush()
        if self._flushes:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*self._flushes), timeout)
