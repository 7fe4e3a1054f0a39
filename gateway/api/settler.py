"""Settles limiter reservations in batches: everything finished in one event-loop turn goes to
Redis in one pipeline, so at high concurrency the post-response round trips are shared."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.limits import Limiter, Reservation


class SettleBatcher:
    def __init__(self, redis: Redis, limiter: Limiter, log: Any) -> None:
        self.redis = redis
        self.limiter = limiter
        self.log = log
        self._pending: list[tuple[Reservation, int, float]] = []
        self._flushes: set[asyncio.Task[None]] = set()
        self._scheduled = False

    def settle(self, reservation: Reservation, tokens: int, cost_usd: float) -> None:
        self._pending.append((reservation, tokens, cost_usd))
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

    async def _flush(self, batch: list[tuple[Reservation, int, float]]) -> None:
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for reservation, tokens, cost_usd in batch:
                    self.limiter.add_settle(pipe, reservation, tokens=tokens, cost_usd=cost_usd)
                await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            # Unsettled reservations keep their estimate; the lease gives budget holds back.
            self.log.warning("settle_failed", count=len(batch), error=type(exc).__name__)

    async def drain(self, timeout: float = 5.0) -> None:
        self._start_flush()
        if self._flushes:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*self._flushes), timeout)
