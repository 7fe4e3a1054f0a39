"""Whether a replica may be asked: ejected when unreachable, probed back with backoff.

A replica is ejected by one failed request (the caller reports connect errors and timeouts
that happened before anything was streamed), or by ``eject_after`` scrapes failing in a row.
An ejected replica is not picked; its next probe (a scrape) is due ``backoff_s`` later, doubling
with each ejection in a row up to ``backoff_max_s``. A probe that succeeds readmits it. The
doubling forgets a replica's past once it has stayed up for ``backoff_max_s``, so a flapping
replica is probed ever more rarely while one that failed once last week starts afresh.

The clock is given, so tests step time instead of sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class HealthSettings:
    eject_after: int = 3  # scrapes failing in a row
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0

    def __post_init__(self) -> None:
        if self.eject_after < 1:
            raise ValueError(f"eject_after must be >= 1, not {self.eject_after}")
        if not 0 < self.backoff_s <= self.backoff_max_s:
            raise ValueError(
                f"backoff_s must be > 0 and <= backoff_max_s ({self.backoff_s}, "
                f"{self.backoff_max_s})"
            )


class ReplicaHealth:
    """One replica's health. ``usable`` is what picks read; the rest explains it."""

    def __init__(self, settings: HealthSettings, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.clock = clock
        self.ejected = False
        self.failures = 0  # scrapes failed in a row while usable
        self.strikes = 0  # ejections in a row (drives the backoff)
        self.probe_at = 0.0  # when an ejected replica is next probed
        self.ejected_at = 0.0
        self.up_since = clock()
        self.last_error: str | None = None

    @property
    def usable(self) -> bool:
        return not self.ejected

    def probe_due(self) -> bool:
        return self.ejected and self.clock() >= self.probe_at

    def probe_delay(self) -> float:
        """Seconds until the next probe of an ejected replica (0 when due or usable)."""
        return max(0.0, self.probe_at - self.clock()) if self.ejected else 0.0

    def current_backoff(self) -> float:
        steps = max(self.strikes - 1, 0)
        return min(self.settings.backoff_s * 2.0**steps, self.settings.backoff_max_s)

    def scrape_failed(self, error: str) -> bool:
        """A scrape (or a probe) failed; True when this ejected the replica just now."""
        self.last_error = error
        if self.ejected:
            self.strikes += 1  # a failed probe: wait longer for the next one
            self.probe_at = self.clock() + self.current_backoff()
            return False
        self.failures += 1
        if self.failures < self.settings.eject_after:
            return False
        self._eject()
        return True

    def request_failed(self, error: str) -> bool:
        """A request could not reach the replica; True when this ejected it just now."""
        self.last_error = error
        if self.ejected:
            return False
        self._eject()
        return True

    def succeeded(self, started_at: float | None = None) -> bool:
        """A scrape or probe answered; True when this readmitted an ejected replica. A scrape
        that started before the replica was ejected (``started_at``) proves nothing since."""
        now = self.clock()
        if self.ejected and started_at is not None and started_at < self.ejected_at:
            return False
        self.failures = 0
        if not self.ejected:
            if self.strikes and now - self.up_since >= self.settings.backoff_max_s:
                self.strikes = 0
            return False
        self.ejected = False
        self.up_since = now
        return True

    def _eject(self) -> None:
        self.ejected = True
        self.ejected_at = self.clock()
        self.failures = 0
        self.strikes += 1
        self.probe_at = self.clock() + self.current_backoff()

    def describe(self) -> dict[str, object]:
        return {
            "state": "ejected" if self.ejected else "healthy",
            "strikes": self.strikes,
            "probe_in_s": round(self.probe_delay(), 3) if self.ejected else None,
            "last_error": self.last_error,
        }
