"""Observed upstream latency per model, as an exponentially weighted moving average."""

from __future__ import annotations


class LatencyTracker:
    """EWMA of time-to-first-byte of successful attempts; the dispatcher feeds it."""

    def __init__(self, alpha: float = 0.3) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha = alpha
        self._ewma: dict[str, float] = {}
        self._samples: dict[str, int] = {}

    def observe(self, model: str, seconds: float) -> None:
        previous = self._ewma.get(model)
        self._ewma[model] = (
            seconds if previous is None else self.alpha * seconds + (1 - self.alpha) * previous
        )
        self._samples[model] = self._samples.get(model, 0) + 1

    def estimate(self, model: str) -> float | None:
        """Seconds, or None before the first sample."""
        return self._ewma.get(model)

    def samples(self, model: str) -> int:
        return self._samples.get(model, 0)

    def snapshot(self) -> dict[str, float]:
        return dict(self._ewma)
