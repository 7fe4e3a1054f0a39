"""The parts a request handler needs, built once by the app factory and handed to handlers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from redis.asyncio import Redis

from gateway.access.auth import Authenticator
from gateway.access.keys import KeyStore
from gateway.access.sessions import SessionStore
from gateway.access.throttle import AuthThrottle
from gateway.metering.accounting import Accountant
from gateway.metering.gate import LimitsGate
from gateway.metering.ledger import UsageLedger
from gateway.metering.limits import Limiter
from gateway.metering.reports import UsageReports
from gateway.metering.settler import SettleBatcher
from gateway.metrics import Metrics
from gateway.providers.local_host import LocalEngineHost
from gateway.providers.registry import ProviderRegistry
from gateway.routing.dispatch import Dispatcher
from gateway.routing.policy_store import PolicyStore
from gateway.routing.router import Router
from gateway.server.shutdown import Drain
from gateway.settings import Settings
from gateway.store.embedded import EmbeddedRedis


class PageRenderer(Protocol):
    """Draws the dashboard's HTML pages (``gateway.api.dashboard_view.DashboardRenderer``)."""

    def render(self, template: str, **context: Any) -> str: ...


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
    # Reserves a request's worst case before the upstream call (one Redis round trip).
    gate: LimitsGate
    settler: SettleBatcher
    # Settles and records each request once it ends.
    accountant: Accountant
    ledger: UsageLedger
    reports: UsageReports
    # The dashboard's server-side sessions.
    sessions: SessionStore
    # Failed admin bearers and dashboard logins, counted per client address.
    auth_throttle: AuthThrottle
    pages: PageRenderer
    # SIGTERM's drain: readiness turns off while in-flight requests finish.
    drain: Drain
    metrics: Metrics
    log: Any
    embedded_redis: EmbeddedRedis | None = None
    # The in-process engine behind a `kind: local` provider (idle when the policy has none).
    local_engine: LocalEngineHost | None = None
    # Set when the key pepper, checked late (Redis was away at start), differs from Redis's.
    key_pepper_mismatch: bool = False
