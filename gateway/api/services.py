"""The parts a request handler needs, built once by the app factory and handed to handlers."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from gateway.api.settler import SettleBatcher
from gateway.auth import Authenticator
from gateway.auth_throttle import AuthThrottle
from gateway.dashboard import DashboardAuth, DashboardRenderer
from gateway.keys import KeyStore
from gateway.limits import Limiter
from gateway.local_engine import LocalEngineHost
from gateway.metrics import Metrics
from gateway.providers.registry import ProviderRegistry
from gateway.reports import UsageReports
from gateway.routing.dispatch import Dispatcher
from gateway.routing.policy_store import PolicyStore
from gateway.routing.router import Router
from gateway.settings import Settings
from gateway.store.embedded import EmbeddedRedis
from gateway.usage import UsageLedger


@dataclass
class Services:
    settings: Settings
    admin_key: str
    redis: Redis
    keys: KeyStore
    auth: Authenticator
    policies: PolicyStore
    router: Router
    providers: ProviderRegistry
    # The one place a plan's candidates are tried (retries, fallbacks, breakers).
    dispatcher: Dispatcher
    limiter: Limiter
    settler: SettleBatcher
    ledger: UsageLedger
    reports: UsageReports
    dashboard_auth: DashboardAuth
    # Failed admin bearers and dashboard logins, counted per client address.
    auth_throttle: AuthThrottle
    dashboard_renderer: DashboardRenderer
    metrics: Metrics
    log: Any
    embedded_redis: EmbeddedRedis | None = None
    # The in-process engine behind a `kind: local` provider (idle when the policy has none).
    local_engine: LocalEngineHost | None = None
    background: set[asyncio.Task[Any]] = field(default_factory=set)
    # Set when the key pepper, checked late (Redis was away at start), differs from Redis's.
    key_pepper_mismatch: bool = False
    # Last time a fail-open warning was logged (monotonic), so an outage logs once a second.
    last_fail_open_warning: float = 0.0

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Run work that must finish even if the client has gone (settling, recording)."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
