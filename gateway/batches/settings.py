"""What the batch part reads of the settings (``SWITCHYARD_BATCH_*``, docs/configuration.md)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.settings import Settings

# OpenAI and Anthropic both run a batch within 24 hours; the only window either accepts.
COMPLETION_WINDOW = "24h"
WINDOW_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class BatchSettings:
    max_file_bytes: int = 100 * 1024 * 1024
    max_lines: int = 50_000
    concurrency: int = 16
    limit_share: float = 0.5
    lease_s: float = 30.0
    poll_interval_s: float = 0.5
    backoff_max_s: float = 60.0
    local_share: float = 0.5
    run: bool = True

    @classmethod
    def from_settings(cls, settings: Settings) -> BatchSettings:
        return cls(
            max_file_bytes=settings.batch_max_file_bytes,
            max_lines=settings.batch_max_lines,
            concurrency=settings.batch_concurrency,
            limit_share=settings.batch_limit_share,
            lease_s=settings.batch_lease_s,
            poll_interval_s=settings.batch_poll_interval_s,
            backoff_max_s=settings.batch_backoff_max_s,
            local_share=settings.batch_local_share,
            run=settings.run_batches,
        )

    @property
    def lease_ms(self) -> int:
        return round(self.lease_s * 1000)
