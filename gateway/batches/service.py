"""``Batches``: what the batch API's handlers are given (the store, the settings, the cancel
marks), and ``build_runner``, which puts the runner together from the gateway's parts and the
``LineRunner`` and ``NativeLines`` the app binds to its pipeline."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from gateway.access.keys import KeyStore
from gateway.access.teams import TeamStore
from gateway.batches.cancels import CancelMarks
from gateway.batches.headroom import Headroom
from gateway.batches.lines import LineRunner
from gateway.batches.local_admission import LocalAdmission
from gateway.batches.native.lines import NativeLines
from gateway.batches.native.runner import NativeRunner
from gateway.batches.runner import BatchRunner
from gateway.batches.store import BatchStore, make_batch_store
from gateway.metering.limits import Limiter
from gateway.policy.store import PolicyStore
from gateway.providers.local_host import LocalEngineHost
from gateway.settings import BatchSettings


@dataclass
class Batches:
    store: BatchStore
    settings: BatchSettings
    cancels: CancelMarks

    @classmethod
    def build(
        cls, store_url: str, data_dir: Path, settings: BatchSettings, redis: Redis
    ) -> Batches:
        return cls(make_batch_store(store_url, data_dir=data_dir), settings, CancelMarks(redis))


def build_runner(
    batches: Batches,
    run_line: LineRunner,
    native_lines: NativeLines,
    *,
    limiter: Limiter,
    keys: KeyStore,
    teams: TeamStore,
    local_engine: LocalEngineHost,
    policies: PolicyStore,
    log: Any,
) -> BatchRunner:
    settings = batches.settings
    return BatchRunner(
        batches.store,
        run_line,
        settings,
        headroom=Headroom(
            limiter, keys, teams, share=settings.limit_share, backoff_max_s=settings.backoff_max_s
        ),
        local=LocalAdmission(local_engine, policies, share=settings.local_share),
        cancels=batches.cancels,
        log=log,
        native=lambda owner: NativeRunner(
            batches.store,
            native_lines,
            settings,
            limiter=limiter,
            cancels=batches.cancels,
            log=log,
            owner=owner,
        ),
    )
