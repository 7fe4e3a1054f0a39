"""The routing health the app builds once: breakers, latency averages, in-flight counts."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.routing.breaker import BreakerBoard
from gateway.routing.inflight import InFlight
from gateway.routing.latency import LatencyTracker
from gateway.settings import BreakerSettings


@dataclass
class RoutingState:
    breakers: BreakerBoard = field(default_factory=BreakerBoard)
    latency: LatencyTracker = field(default_factory=LatencyTracker)
    inflight: InFlight = field(default_factory=InFlight)

    @classmethod
    def build(
        cls,
        breaker_settings: BreakerSettings | None = None,
        latency_alpha: float = 0.3,
        clock: Callable[[], float] = time.monotonic,
    ) -> RoutingState:
        return cls(BreakerBoard(breaker_settings, clock), LatencyTracker(latency_alpha), InFlight())

    def snapshot(self) -> dict[str, object]:
        """For metrics and ``/admin`` views."""
        return {
            "breakers": self.breakers.states(),
            "latency_ewma_s": self.latency.snapshot(),
            "inflight": self.inflight.snapshot(),
        }
