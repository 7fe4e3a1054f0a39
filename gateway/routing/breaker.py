"""Circuit breakers, one per provider/model, so a failing upstream stops taking traffic.

closed → open after N consecutive failures, or when the failure ratio over the last ``window``
calls reaches ``failure_ratio``; open → half_open once ``cooldown_s`` has passed, letting one
probe through; the probe's success closes the breaker, its failure opens it again.

An outcome that arrives while the breaker is open (a call let through before it opened, such as
a long stream) is counted, but neither closes the breaker nor moves its cool-down.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Literal

from gateway.settings import BreakerSettings

BreakerState = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    def __init__(self, settings: BreakerSettings, clock: Callable[[], float]) -> None:
        self.settings = settings
        self._clock = clock
        self._state: BreakerState = "closed"
        self._consecutive = 0
        self._outcomes: deque[bool] = deque(maxlen=settings.window)  # True = failure
        self._opened_at = 0.0
        self._probe_in_flight = False

    @property
    def state(self) -> BreakerState:
        if self._state == "open" and self._clock() - self._opened_at >= self.settings.cooldown_s:
            self._state = "half_open"
            self._probe_in_flight = False
        return self._state

    def allow(self) -> bool:
        """May a call go through now? In half_open, only one probe at a time."""
        state = self.state
        if state == "closed":
            return True
        if state == "half_open" and not self._probe_in_flight:
            self._probe_in_flight = True
            return True
        return False

    def would_allow(self) -> bool:
        """What ``allow()`` would answer now, without taking the probe slot (for previews)."""
        state = self.state
        return state == "closed" or (state == "half_open" and not self._probe_in_flight)

    def release_probe(self) -> None:
        """The allowed call never reached the upstream (e.g. skipped): free the probe slot."""
        self._probe_in_flight = False

    def record_success(self) -> None:
        self._consecutive = 0
        self._outcomes.append(False)
        if self.state == "half_open":
            self._state = "closed"
            self._outcomes.clear()
            self._probe_in_flight = False

    def record_failure(self) -> None:
        self._consecutive += 1
        self._outcomes.append(True)
        state = self.state
        if state == "half_open" or (state == "closed" and self._should_open()):
            self._open()

    def _should_open(self) -> bool:
        settings = self.settings
        if self._consecutive >= settings.consecutive_failures:
            return True
        calls = len(self._outcomes)
        return calls >= settings.min_calls and sum(self._outcomes) / calls >= settings.failure_ratio

    def _open(self) -> None:
        self._state = "open"
        self._opened_at = self._clock()
        self._probe_in_flight = False


class BreakerBoard:
    """All breakers, created on first use, keyed ``provider/model``."""

    def __init__(
        self, settings: BreakerSettings | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings or BreakerSettings()
        self._clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}

    @staticmethod
    def key(provider: str, model: str) -> str:
        return f"{provider}/{model}"

    def get(self, provider: str, model: str) -> CircuitBreaker:
        name = self.key(provider, model)
        breaker = self._breakers.get(name)
        if breaker is None:
            breaker = self._breakers[name] = CircuitBreaker(self.settings, self._clock)
        return breaker

    def state_of(self, provider: str, model: str) -> BreakerState:
        breaker = self._breakers.get(self.key(provider, model))
        return breaker.state if breaker else "closed"

    def would_allow(self, provider: str, model: str) -> bool:
        breaker = self._breakers.get(self.key(provider, model))
        return breaker.would_allow() if breaker else True

    def reset(self, settings: BreakerSettings | None = None) -> None:
        """Forget every breaker (all closed again), optionally with new thresholds."""
        if settings is not None:
            self.settings = settings
        self._breakers.clear()

    def states(self) -> dict[str, BreakerState]:
        """{``provider/model``: state} for metrics and explain."""
        return {name: breaker.state for name, breaker in self._breakers.items()}
