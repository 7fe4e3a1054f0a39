"""The running gateway's parts: ``Services`` (what a request handler is handed) and
``running_services``, which builds them from the settings and starts them.

Building is plain construction, no I/O: every part takes its own section of the settings
(``settings.retry``, ``settings.breaker`` and the like). Starting walks one list of ``Part``s
in order (embedded Redis, the Redis client and its key-pepper check, the policy, the engine,
...); each part started is stopped again in reverse order, also when a later part fails to
start, so a refused start never leaves the embedded Redis behind.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.access.admins import AdminTokens
from gateway.access.auth import Authenticator
from gateway.access.keys import PEPPER_FINGERPRINT_KEY, KeyStore, PepperMismatch, check_pepper
from gateway.access.sessions import SessionStore
from gateway.access.teams import TeamStore
from gateway.access.throttle import AuthThrottle
from gateway.alerts.deliverer import AlertDeliverer
from gateway.alerts.outbox import AlertOutbox
from gateway.audit.trail import AuditTrail
from gateway.batches.service import Batches
from gateway.cache import ResponseCache
from gateway.ledger import StoreConfigError, UsageStore, make_store
from gateway.metering.accounting import Accountant
from gateway.metering.buffer import UsageBuffer
from gateway.metering.exporter import UsageExporter
from gateway.metering.gate import LimitsGate
from gateway.metering.legacy import LegacyImport
from gateway.metering.limits import Limiter, LimiterUnavailable
from gateway.metering.moves import LimitMoves
from gateway.metering.recorder import UsageRecorder
from gateway.metering.reports import UsageReports
from gateway.metering.settler import SettleBatcher
from gateway.metering.spool import Spool
from gateway.metrics import Metrics
from gateway.policy import PolicyError
from gateway.policy.store import PolicyStore
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.azure_openai import AzureOpenAIProvider
from gateway.providers.clouds import cloud_factories
from gateway.providers.fleet_host import FleetHost
from gateway.providers.http_provider import HttpProvider
from gateway.providers.local_host import LocalEngineHost
from gateway.providers.registry import ProviderRegistry
from gateway.routing.dispatch import Dispatcher
from gateway.routing.router import Router
from gateway.routing.state import RoutingState
from gateway.server.shutdown import Drain
from gateway.server.tasks import cancel_until_done
from gateway.settings import Secrets, Settings, SettingsError
from gateway.store.connect import REDIS_FAILURES, connect_redis, warm_up
from gateway.store.embedded import EmbeddedRedis
from gateway.tracing import Tracing, TracingConfigError, build_tracing


class PageRenderer(Protocol):
    """Draws the dashboard's HTML pages (``gateway.api.dashboard.view.DashboardRenderer``)."""

    def render(self, template: str, **context: Any) -> str: ...


@dataclass
class Services:
    settings: Settings
    admin_key: str
    redis: Redis
    keys: KeyStore
    teams: TeamStore
    auth: Authenticator
    # The bootstrap admin key and the named admin tokens, with their roles.
    admins: AdminTokens
    policies: PolicyStore
    router: Router
    providers: ProviderRegistry
    # The one place a plan's candidates are tried (retries, fallbacks, breakers).
    dispatcher: Dispatcher
    limiter: Limiter
    # Carries a key's limiter counters to its new home when it changes teams.
    moves: LimitMoves
    # Reserves a request's worst case before the upstream call (one Redis round trip).
    gate: LimitsGate
    settler: SettleBatcher
    # POSTs budget alerts from the outbox to the webhook (a background part).
    alerts: AlertDeliverer
    # Settles and records each request once it ends.
    accountant: Accountant
    recorder: UsageRecorder
    # Every usage event, in SQL (embedded SQLite or a shared PostgreSQL): what reports read.
    usage_store: UsageStore
    # Moves usage events from the Redis buffer into the store, beside the requests.
    exporter: UsageExporter
    reports: UsageReports
    # Every admin action, who did it and from where (SQL, beside usage).
    audit: AuditTrail
    # The dashboard's server-side sessions.
    sessions: SessionStore
    # Failed admin bearers and dashboard logins, counted per client address.
    auth_throttle: AuthThrottle
    pages: PageRenderer
    # SIGTERM's drain: readiness turns off while in-flight requests finish.
    drain: Drain
    metrics: Metrics
    log: Any
    # The in-process engine behind a `kind: local` provider (idle when the policy has none).
    local_engine: LocalEngineHost
    # The policy's `kind: engine_fleet` providers (replica discovery, scrapes, picks).
    fleets: FleetHost
    # Answers of the policy's `cache:` models and tasks (cache.md).
    cache: ResponseCache
    # Spans of /v1 requests; shared no-ops unless OTEL_* variables turn it on (tracing.md).
    tracing: Tracing
    # Batch files, batches and their lines in the SQL store (batches.md); the runner that
    # works them is started by the app, which binds it to the pipeline.
    batches: Batches
    embedded_redis: EmbeddedRedis | None = None
    # Set when the key pepper, checked late (Redis was away at start), differs from Redis's.
    key_pepper_mismatch: bool = False


def build_services(
    settings: Settings, secrets: Secrets, log: Any, drain: Drain, pages: PageRenderer
) -> Services:
    """Every part, built and wired, none started."""
    embedded = EmbeddedRedis(settings.redis_dir) if settings.embedded_redis else None
    redis = connect_redis(
        embedded.url if embedded else settings.redis_url, settings.redis_timeout_s
    )
    policies = PolicyStore(settings.policy_file, fallback=settings.policy_fallback)
    keys = KeyStore(redis, secrets.key_pepper)
    limiter = Limiter(redis, in_flight_lease_s=settings.inflight_lease_s)
    auth = Authenticator(keys, settings.auth, fail_open=settings.limits.fail_open)
    moves = LimitMoves(redis, keys, limiter, log)
    admins = AdminTokens(redis, secrets.key_pepper, secrets.admin_key)
    usage_store = make_store(
        settings.usage_store.url,
        data_dir=settings.data_dir,
        retention_days=settings.usage_store.retention_days,
    )
    buffer = UsageBuffer(redis)  # named after the store once it is open
    recorder = UsageRecorder(buffer, spool=Spool(settings.data_dir / "spool"))
    outbox = AlertOutbox(redis) if settings.alerts.enabled else None
    settler = SettleBatcher(
        redis,
        limiter,
        recorder,
        log,
        alerts=outbox,
        spool=Spool(settings.data_dir / "settle-spool"),
    )
    state = RoutingState.build(settings.breaker, settings.route_latency_alpha)
    metrics = Metrics()
    metrics.watch_routing(state.snapshot)
    exporter = UsageExporter(
        buffer,
        usage_store,
        settings.export,
        metrics,
        log,
        legacy=LegacyImport(redis, usage_store, log),
    )
    metrics.watch_spool(recorder.spool_depth, settler.spool_depth)
    # The in-process engine (only if the policy has a local provider), loaded when started.
    local_engine = LocalEngineHost(settings.data_dir, metrics, log)
    upstream = settings.upstream
    try:
        tracing = build_tracing(capture_prompts=settings.trace_capture_prompts)
    except TracingConfigError as exc:
        raise SettingsError(str(exc)) from None
    fleets = FleetHost(upstream, metrics, log)
    providers = ProviderRegistry(
        {
            "openai_compatible": lambda name, config: HttpProvider(name, config, upstream),
            "azure_openai": lambda name, config: AzureOpenAIProvider(name, config, upstream),
            "anthropic": lambda name, config: AnthropicProvider(name, config, upstream),
            "local": local_engine.provider_for,
            "engine_fleet": fleets.provider_for,
            **cloud_factories(upstream),  # gemini, vertex_ai, bedrock
        }
    )
    return Services(
        settings=settings,
        admin_key=secrets.admin_key,
        redis=redis,
        keys=keys,
        teams=TeamStore(redis),
        auth=auth,
        admins=admins,
        policies=policies,
        router=Router(policies, state),
        providers=providers,
        dispatcher=Dispatcher(state, settings.retry, providers=providers),
        limiter=limiter,
        moves=moves,
        gate=LimitsGate(
            limiter,
            settings.limits,
            metrics,
            log,
            moves=moves,
            refresh=auth.refresh,
        ),
        settler=settler,
        alerts=AlertDeliverer(redis, settings.alerts, log),
        accountant=Accountant(settler, limiter, metrics, log),
        recorder=recorder,
        usage_store=usage_store,
        exporter=exporter,
        reports=UsageReports(usage_store, buffer, key_labels=keys.labels),
        audit=AuditTrail(settings.usage_store, settings.data_dir, log),
        sessions=SessionStore(redis, secrets.admin_key, admins),
        auth_throttle=AuthThrottle(redis, settings.throttle, log=log, metrics=metrics),
        pages=pages,
        drain=drain,
        metrics=metrics,
        log=log,
        embedded_redis=embedded,
        local_engine=local_engine,
        cache=ResponseCache(redis),
        tracing=tracing,
        fleets=fleets,
        batches=Batches.build(settings.usage_store.url, settings.data_dir, settings.batches, redis),
    )


async def close_redis(client: Redis, log: Any) -> None:
    """Close ``client``'s pool. Its sockets are shut by then even when one's close handshake
    times out on a busy host, so that timeout is logged, not raised into the shutdown."""
    try:
        await client.aclose()
    except (RedisTimeoutError, RedisConnectionError) as error:
        log.warning("redis_close_slow", error=str(error))


@dataclass(frozen=True)
class Part:
    """One piece of the running gateway: ``start`` in order, ``stop`` in reverse."""

    name: str
    start: Callable[[], Awaitable[None]] | None = None
    stop: Callable[[], Awaitable[None]] | None = None


@contextlib.asynccontextmanager
async def running_services(
    settings: Settings, secrets: Secrets, log: Any, drain: Drain, pages: PageRenderer
) -> AsyncIterator[Services]:
    """The services, started part by part; stopped in reverse when the block ends."""
    services = build_services(settings, secrets, log, drain, pages)
    async with contextlib.AsyncExitStack() as started:
        for part in _parts(services, secrets.key_pepper):
            if part.start is not None:
                await part.start()
            if part.stop is not None:
                started.push_async_callback(part.stop)
        yield services


def _parts(services: Services, pepper: bytes) -> list[Part]:
    """The start order; stopping runs it backwards (the settle batch drains before the recorder
    stops and the exporter's last round, the store closes after it, the engine and the fleets
    stop after the providers, Redis closes last)."""
    redis = _RedisWatch(services, pepper)
    parts = []
    if services.embedded_redis is not None:
        parts.append(_embedded_redis(services.embedded_redis, services.log))
    policies, engine, store = services.policies, services.local_engine, services.usage_store
    parts += [
        Part("redis", start=redis.connect, stop=lambda: close_redis(services.redis, services.log)),
        Part("usage store", start=lambda: _open_usage_store(services), stop=store.close),
        Part("batch store", start=services.batches.store.open, stop=services.batches.store.close),
        Part("policy", start=lambda: _load_policy(services)),
        Part(
            "local engine", start=lambda: engine.start(policies.policy_or_none()), stop=engine.stop
        ),
        Part("fleets", start=lambda: services.fleets.start(policies), stop=services.fleets.stop),
        Part("providers", stop=services.providers.close),
        Part("policy watch", start=_now(policies.start_watching), stop=policies.stop),
        Part("releases", stop=services.accountant.wait_background),
        Part("usage export", start=services.exporter.start, stop=services.exporter.stop),
        Part("usage recorder", start=services.recorder.start, stop=services.recorder.stop),
        Part("settle spool", start=services.settler.start, stop=services.settler.stop),
        Part("settle batch", stop=services.settler.drain),
        Part("response cache", stop=services.cache.drain),
        Part("tracing", start=_now(lambda: _log_tracing(services)), stop=services.tracing.aclose),
        Part("audit log", start=services.audit.start, stop=services.audit.stop),
        _background("limit moves", lambda: services.moves.run()),
        _background("in-flight leases", lambda: _renew_in_flight(services)),
        _background("budget alerts", lambda: services.alerts.run()),
        Part("watchers", start=redis.start_watching, stop=redis.stop_watching),
    ]
    return parts


def _background(name: str, run: Callable[[], Awaitable[None]]) -> Part:
    """A task beside the requests, started with the parts and cancelled when they stop."""
    tasks: list[asyncio.Task[None]] = []

    async def start() -> None:
        tasks.append(asyncio.create_task(run()))

    async def stop() -> None:
        await cancel_until_done(tasks)

    return Part(name, start=start, stop=stop)


async def _renew_in_flight(services: Services) -> None:
    """Renew this gateway's in-flight leases a few times per lease, so that they lapse only
    when it is gone."""
    limiter = services.limiter
    while True:
        await asyncio.sleep(limiter.in_flight_lease_ms / 3000)
        try:
            await limiter.renew_in_flight()
        except LimiterUnavailable as exc:  # Redis away: the leases may lapse; retry next turn
            services.log.warning("in_flight_renewal_failed", error=str(exc))


def _now(start: Callable[[], None]) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        start()

    return run


def _log_tracing(services: Services) -> None:
    tracing = services.tracing
    services.log.info("tracing", enabled=tracing.enabled, reason=tracing.reason)


def _embedded_redis(server: EmbeddedRedis, log: Any) -> Part:
    async def start() -> None:
        await asyncio.to_thread(server.start)
        log.info("embedded_redis_started", data_dir=str(server.data_dir))

    async def stop() -> None:
        await asyncio.to_thread(server.stop)
        log.info("embedded_redis_stopped")

    return Part("embedded redis", start=start, stop=stop)


async def _open_usage_store(services: Services) -> None:
    """Open (create, migrate) the usage store and name the Redis buffer after it. A store that
    cannot be opened refuses the start: this replica could not tell which buffer is its own."""
    store = services.usage_store
    try:
        await store.open()
    except StoreConfigError as exc:
        raise SettingsError(f"SWITCHYARD_USAGE_STORE_URL: {exc}") from None
    services.recorder.buffer.bind(store.store_id)
    services.log.info("usage_store_opened", backend=store.kind, store_id=store.store_id)


async def _load_policy(services: Services) -> None:
    log = services.log
    try:
        loaded = services.policies.load()
        log.info("policy_loaded", version=loaded.version, file=loaded.source)
    except PolicyError as exc:  # the gateway starts; /readyz says the policy is not loaded
        log.error("policy_load_failed", path=exc.path, error=exc.message)


class _RedisWatch:
    """Redis at start (a cluster's topology warmed, the key pepper checked), and the tasks that
    watch it beside the requests: key-change notices (to drop cached keys), the embedded
    server's supervisor, and a late pepper check when Redis was away at start."""

    def __init__(self, services: Services, pepper: bytes) -> None:
        self.services = services
        self.pepper = pepper
        self.pepper_checked = False
        self._tasks: list[asyncio.Task[None]] = []

    async def connect(self) -> None:
        """Reach Redis (a cluster's topology, when it answers) and check the key pepper."""
        services = self.services
        warm_up_error = await warm_up(services.redis)
        if warm_up_error is not None:
            services.log.warning("redis_cluster_unreachable_at_start", error=warm_up_error)
        self.pepper_checked = await self._check_pepper()

    async def start_watching(self) -> None:
        services = self.services
        self._tasks.append(
            asyncio.create_task(services.auth.watch_changes(services.redis, services.log))
        )
        if not self.pepper_checked:
            self._tasks.append(asyncio.create_task(self._check_pepper_later()))
        if services.embedded_redis is not None:
            self._tasks.append(asyncio.create_task(self._supervise(services.embedded_redis)))

    async def stop_watching(self) -> None:
        await cancel_until_done(self._tasks)

    async def _check_pepper(self) -> bool:
        """True once the pepper is known to match this Redis's (adopted or checked); False when
        Redis cannot say now. A mismatch raises ``SettingsError``: this replica must not
        serve."""
        log = self.services.log
        try:
            adopted = await check_pepper(self.services.redis, self.pepper)
        except PepperMismatch as exc:
            raise SettingsError(str(exc)) from None
        except REDIS_FAILURES as exc:
            log.warning("key_pepper_unchecked", error=type(exc).__name__)
            return False
        if adopted:
            log.info("key_pepper_adopted", key=PEPPER_FINGERPRINT_KEY)
        return True

    async def _check_pepper_later(self) -> None:
        """Redis was away at start: check the pepper once it answers. A mismatch found now
        makes this replica unready (``/readyz`` → 503) and logs an error naming the setting."""
        while True:
            await asyncio.sleep(1.0)
            try:
                if await self._check_pepper():
                    return
            except SettingsError as exc:
                self.services.key_pepper_mismatch = True
                self.services.log.error("key_pepper_mismatch", error=str(exc))
                return

    async def _supervise(self, server: EmbeddedRedis) -> None:
        """Restart the embedded Redis if it dies; AOF brings its data back."""
        services = self.services
        while True:
            await asyncio.sleep(services.settings.redis_supervise_interval_s)
            if server.is_running():
                continue
            try:
                await asyncio.to_thread(server.ensure_running)
                services.metrics.redis_restarts.inc()
                services.log.warning("embedded_redis_restarted", data_dir=str(server.data_dir))
            except Exception as exc:  # keep supervising; the next tick tries again
                services.log.error("embedded_redis_restart_failed", error=str(exc))
