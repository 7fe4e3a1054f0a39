"""The background task that replays a local spool into Redis, every few seconds while the
spool holds anything: the one loop behind the usage spool (``recorder``) and the settle spool
(``settler``).

A round that fails waits for the next one. Redis still away is logged as deferred; anything
else is logged as an error with its traceback, and the loop goes on, so one bad round never
leaves a spool unreplayed until the next restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.metering.spool import Spool
from gateway.server.tasks import cancel_until_done
from gateway.store.connect import REDIS_FAILURES


class ReplayLoop:
    """Replays ``spool`` with ``replay`` every ``interval_s`` once started. ``name`` prefixes
    its log events (``<name>_replay_deferred``, ``<name>_replay_failed``) and names its task."""

    def __init__(
        self,
        name: str,
        spool: Spool,
        replay: Callable[[], Awaitable[object]],
        *,
        interval_s: float,
        log: Any,
    ) -> None:
        self.name = name
        self.spool = spool
        self.replay = replay
        self.interval_s = interval_s
        self.log = log
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"{self.name}-replay")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_until_done([task])

    async def _run(self) -> None:
        while True:
            if self.spool.depth():
                await self.replay_once()
            await asyncio.sleep(self.interval_s)

    async def replay_once(self) -> None:
        """One round; what it raises is logged, never raised (cancellation aside)."""
        try:
            await self.replay()
        except REDIS_FAILURES as exc:
            self.log.info(f"{self.name}_replay_deferred", reason=type(exc).__name__)
        except Exception as exc:
            self.log.error(f"{self.name}_replay_failed", reason=type(exc).__name__, exc_info=True)
