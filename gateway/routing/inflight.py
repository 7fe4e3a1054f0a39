"""Per-provider in-flight counters: a provider at ``max_concurrency`` is skipped, not queued."""

from __future__ import annotations


class InFlight:
    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def try_acquire(self, provider: str, limit: int | None) -> bool:
        current = self._counts.get(provider, 0)
        if limit is not None and current >= limit:
            return False
        self._counts[provider] = current + 1
        return True

    def release(self, provider: str) -> None:
        remaining = self._counts.get(provider, 0) - 1
        if remaining > 0:
            self._counts[provider] = remaining
        else:
            self._counts.pop(provider, None)

    def count(self, provider: str) -> int:
        return self._counts.get(provider, 0)

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)
