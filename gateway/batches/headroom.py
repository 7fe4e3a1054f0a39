"""Batch lines take only what interactive traffic leaves.

``Headroom.wait_s(key_id)``: a line of a key may start while the key's window (and its team's)
has used less than ``share`` of its RPM and TPM, counting every request of the key, interactive
and batch alike; above it the line waits a sub-bucket and looks again. So interactive requests
always keep at least ``1 - share`` of the limits for themselves. The check is read before the
reserve, not inside it: the lines already past it may overshoot the share by at most the
runner's concurrency, never the limit itself (the reserve still enforces that).

A 429 the line got anyway (a limit, or the provider's own) makes the key back off: every line
of the key waits, the pause doubling from one sub-bucket up to ``backoff_max_s`` while 429s
go on, or the Retry-After asked for; a line that succeeds ends it.

The local engine is ``local_admission.py``'s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.access.keys import KeyRecord, KeyStore
from gateway.access.teams import TeamStore
from gateway.metering.limits import KeyLimits, Limiter

RECORD_TTL_S = 1.0


@dataclass
class _Backoff:
    until: float = 0.0
    pause_s: float = 0.0


class Headroom:
    def __init__(
        self,
        limiter: Limiter,
        keys: KeyStore,
        teams: TeamStore,
        *,
        share: float,
        backoff_max_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limiter = limiter
        self.keys = keys
        self.teams = teams
        self.share = share
        self.backoff_max_s = backoff_max_s
        self.clock = clock
        self.bucket_s = limiter.window_ms / limiter.buckets / 1000
        self._records: dict[str, tuple[float, KeyRecord | None]] = {}
        self._backoff: dict[str, _Backoff] = {}

    async def wait_s(self, key_id: str) -> float:
        """0 when a line of ``key_id`` may start now, else how long to wait first."""
        backoff = self._backoff.get(key_id)
        now = self.clock()
        if backoff is not None and backoff.until > now:
            return backoff.until - now
        record = await self._record(key_id)
        if record is None:  # gone: the line fails authentication, promptly
            return 0.0
        if record.rpm is not None or record.tpm is not None:
            limits = KeyLimits(rpm=record.rpm, tpm=record.tpm)
            status = await self.limiter.status(key_id, limits, record.home)
            if self._over(status, record.rpm, record.tpm):
                return self.bucket_s
        if record.team is not None:
            team = await self.teams.get(record.team)
            if team is not None and (team.rpm is not None or team.tpm is not None):
                status = await self.limiter.team_status(
                    team.id, rpm=team.rpm, tpm=team.tpm, budgets_nanos={}, max_parallel=None
                )
                if self._over(status, team.rpm, team.tpm):
                    return self.bucket_s
        return 0.0

    def _over(self, status: dict[str, Any], rpm: int | None, tpm: int | None) -> bool:
        for window, limit in ((status["requests"], rpm), (status["tokens"], tpm)):
            if limit is not None and window["used"] >= math.floor(self.share * limit):
                return True
        return False

    async def _record(self, key_id: str) -> KeyRecord | None:
        cached = self._records.get(key_id)
        now = self.clock()
        if cached is not None and now - cached[0] < RECORD_TTL_S:
            return cached[1]
        record = await self.keys.get(key_id)
        if len(self._records) > 10_000:
            self._records.clear()
        self._records[key_id] = (now, record)
        return record

    def refused(self, key_id: str, retry_after_s: float | None) -> float:
        """A line of the key got a 429: the key's lines pause; returns the pause."""
        backoff = self._backoff.setdefault(key_id, _Backoff())
        backoff.pause_s = min(max(backoff.pause_s * 2, self.bucket_s), self.backoff_max_s)
        pause = backoff.pause_s
        if retry_after_s is not None:
            pause = min(max(pause, retry_after_s), self.backoff_max_s)
        backoff.until = self.clock() + pause
        return pause

    def answered(self, key_id: str) -> None:
        self._backoff.pop(key_id, None)
