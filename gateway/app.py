"""The app factory: ``create_app(settings)`` builds a Starlette app whose lifespan owns every part.

Nothing lives in module globals: the lifespan starts (or connects to) Redis, loads the policy,
builds the key store, authenticator, limiter, router, dispatcher and provider clients, hands
them to handlers through the lifespan state, and takes them down again in reverse order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
from collections.abc import AsyncIterator
from typing import IO, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.access.auth import Authenticator
from gateway.access.keys import PEPPER_FINGERPRINT_KEY, KeyStore, PepperMismatch, check_pepper
from gateway.access.sessions import SessionStore
from gateway.access.throttle import AuthThrottle
from gateway.api import admin, dashboard, openai, ops, policy, usage
from gateway.api.dashboard_view import DashboardRenderer
from gateway.api.http import error_response
from gateway.errors import GatewayError, MethodNotAllowed, NotFound, echo
from gateway.logs import LazyFlushStream, build_logger
from gateway.metering.accounting import Accountant
from gateway.metering.gate import LimiterSettings, LimitsGate
from gateway.metering.ledger import UsageLedger
from gateway.metering.limits import Limiter
from gateway.metering.reports import UsageReports
from gateway.metering.settler import SettleBatcher
from gateway.metering.spool import Spool
from gateway.metrics import Metrics
from gateway.providers.base import Timeouts
from gateway.providers.local_host import LocalEngineHost
from gateway.providers.openai_compat import OpenAICompatProvider, ResponseLimits
from gateway.providers.registry import ProviderRegistry
from gateway.routing.breaker import BreakerSettings
from gateway.routing.dispatch import Dispatcher, RetrySettings
from gateway.routing.policy import PolicyError
from gateway.routing.policy_store import PolicyStore
from gateway.routing.router import Router
from gateway.routing.state import RoutingState
from gateway.server.exchange import ExchangeMiddleware, record_wire_rejection, request_id_of
from gateway.server.shutdown import Drain, DrainMiddleware, sigterm_drain
from gateway.services import Services
from gateway.settings import Secrets, Settings, SettingsError, ensure_secrets, load_settings
from gateway.store.connect import REDIS_FAILURES, RedisClient, connect_redis, warm_up
from gateway.store.embedded import EmbeddedRedis


async def _supervise(server: EmbeddedRedis, services: Services) -> None:
    """Restart the embedded Redis if it dies; AOF brings its data back."""
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


async def _stop_embedded(server: EmbeddedRedis, log: Any) -> None:
    await asyncio.to_thread(server.stop)
    log.info("embedded_redis_stopped")


async def _check_pepper(redis: RedisClient, pepper: bytes, log: Any) -> bool:
    """True once the pepper is known to match this Redis's (adopted or checked); False when
    Redis cannot say now. A mismatch raises ``SettingsError``: this replica must not serve."""
    try:
        adopted = await check_pepper(redis, pepper)
    except PepperMismatch as exc:
        raise SettingsError(str(exc)) from None
    except REDIS_FAILURES as exc:
        log.warning("key_pepper_unchecked", error=type(exc).__name__)
        return False
    if adopted:
        log.info("key_pepper_adopted", key=PEPPER_FINGERPRINT_KEY)
    return True


async def _check_pepper_later(services: Services, pepper: bytes) -> None:
    """Redis was away at start: check the pepper once it answers. A mismatch found now makes
    this replica unready (``/readyz`` → 503) and logs an error naming the setting."""
    while True:
        await asyncio.sleep(1.0)
        try:
            if await _check_pepper(services.redis, pepper, services.log):
                return
        except SettingsError as exc:
            services.key_pepper_mismatch = True
            services.log.error("key_pepper_mismatch", error=str(exc))
            return


@contextlib.asynccontextmanager
async def running_services(
    settings: Settings, secrets: Secrets, log: Any, drain: Drain
) -> AsyncIterator[Services]:
    async with (
        contextlib.AsyncExitStack() as cleanup,
        _started_services(settings, secrets, log, drain, cleanup) as services,
    ):
        yield services


@contextlib.asynccontextmanager
async def _started_services(
    settings: Settings,
    secrets: Secrets,
    log: Any,
    drain: Drain,
    cleanup: contextlib.AsyncExitStack,
) -> AsyncIterator[Services]:
    """Everything started before a failure is stopped again by ``cleanup`` (a refused start
    never leaves the embedded Redis behind)."""
    embedded: EmbeddedRedis | None = None
    url = settings.redis_url
    if settings.embedded_redis:
        embedded = EmbeddedRedis(settings.redis_dir)
        url = await asyncio.to_thread(embedded.start)
        cleanup.push_async_callback(_stop_embedded, embedded, log)
        log.info("embedded_redis_started", data_dir=str(settings.redis_dir))
    redis = connect_redis(url, settings.redis_timeout_s)
    cleanup.push_async_callback(redis.aclose)
    warm_up_error = await warm_up(redis)
    if warm_up_error is not None:
        log.warning("redis_cluster_unreachable_at_start", error=warm_up_error)
    pepper_checked = await _check_pepper(redis, secrets.key_pepper, log)
    policies = PolicyStore(settings.policy_file)
    try:
        loaded = policies.load()
        log.info("policy_loaded", version=loaded.version, file=str(settings.policy_file))
    except PolicyError as exc:
        log.error("policy_load_failed", path=exc.path, error=exc.message)
    keys = KeyStore(redis, secrets.key_pepper)
    limiter = Limiter(redis)
    ledger = UsageLedger(redis, spool=Spool(settings.data_dir / "spool"))
    settler = SettleBatcher(redis, limiter, ledger, log)
    state = RoutingState.build(
        BreakerSettings(
            consecutive_failures=settings.breaker_consecutive_failures,
            failure_ratio=settings.breaker_failure_ratio,
            window=settings.breaker_window,
            min_calls=settings.breaker_min_calls,
            cooldown_s=settings.breaker_cooldown_s,
        ),
        latency_alpha=settings.route_latency_alpha,
    )
    metrics = Metrics(routing=state)
    auth_throttle = AuthThrottle(
        redis,
        limit=settings.auth_failure_limit,
        window_s=settings.auth_failure_window_s,
        log=log,
        metrics=metrics,
    )
    # The in-process engine (only if the policy has a local provider), loaded in a thread.
    local_engine = LocalEngineHost(settings.data_dir, metrics, log)
    await local_engine.start(policies.current.policy if policies.loaded else None)
    upstream = Timeouts(
        settings.upstream_connect_timeout_s,
        settings.upstream_read_timeout_s,
        settings.upstream_total_timeout_s,
    )
    limits = ResponseLimits(settings.upstream_max_body_bytes, settings.upstream_max_event_bytes)
    providers = ProviderRegistry(
        {
            "openai_compatible": lambda name, config: OpenAICompatProvider(
                name, config, upstream, settings.upstream_pool_size, limits
            ),
            "local": local_engine.provider_for,
        }
    )
    services = Services(
        settings=settings,
        admin_key=secrets.admin_key,
        redis=redis,
        keys=keys,
        auth=Authenticator(
            keys,
            cache_ttl_s=settings.auth_cache_ttl_s,
            fail_open=settings.limits_on_redis_failure == "open",
            fail_open_window_s=settings.fail_open_window_s,
        ),
        policies=policies,
        router=Router(policies, state),
        providers=providers,
        dispatcher=Dispatcher(
            state,
            RetrySettings(
                max_tries_per_candidate=settings.upstream_max_tries,
                initial_backoff_s=settings.upstream_backoff_initial_s,
                max_backoff_s=settings.upstream_backoff_max_s,
                jitter_s=settings.upstream_backoff_jitter_s,
                max_retry_after_s=settings.upstream_max_retry_after_s,
                total_budget_s=settings.upstream_retry_budget_s,
            ),
            providers=providers,
        ),
        limiter=limiter,
        gate=LimitsGate(limiter, LimiterSettings.from_settings(settings), metrics, log),
        settler=settler,
        accountant=Accountant(settler, limiter, metrics, log),
        ledger=ledger,
        reports=UsageReports(redis),
        sessions=SessionStore(redis, secrets.admin_key),
        auth_throttle=auth_throttle,
        pages=DashboardRenderer(),
        drain=drain,
        metrics=metrics,
        log=log,
        embedded_redis=embedded,
        local_engine=local_engine,
    )
    services.metrics.watch_spool(ledger.spool_depth)
    tasks = [asyncio.create_task(services.auth.watch_changes(redis, log))]
    if not pepper_checked:
        tasks.append(asyncio.create_task(_check_pepper_later(services, secrets.key_pepper)))
    if embedded is not None:
        tasks.append(asyncio.create_task(_supervise(embedded, services)))
    policies.start_watching()
    await ledger.start()
    try:
        yield services
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await services.settler.drain()
        await ledger.stop()
        await services.accountant.wait_background()  # releases still in flight
        await policies.stop()
        await services.providers.close()
        await local_engine.stop()


async def _flush_logs(sink: LazyFlushStream, interval_s: float = 0.2) -> None:
    while True:
        await asyncio.sleep(interval_s)
        sink.flush_now()


def _render_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error: GatewayError
    path = echo(request.url.path)
    if exc.status_code == 404:
        error = NotFound(f"no such endpoint: {request.method} {path}", code=None)
    elif exc.status_code == 405:
        error = MethodNotAllowed(f"{request.method} is not allowed on {path}")
    else:
        error = GatewayError(str(exc.detail))
        error.status = exc.status_code  # type: ignore[misc]
    return error_response(error, {"x-request-id": request_id_of(request)})


def _client_gone(request: Request, exc: Exception) -> Response:
    # The client disconnected (or was cut off by a body deadline): nobody reads this answer.
    return Response(status_code=499)


def create_app(settings: Settings | None = None, *, log_stream: IO[Any] | None = None) -> Starlette:
    settings = settings if settings is not None else load_settings()
    secrets = ensure_secrets(settings)
    raw_stream = log_stream if log_stream is not None else sys.stdout
    sink: LazyFlushStream | None = None
    if settings.log_format == "json":
        sink = LazyFlushStream(getattr(raw_stream, "buffer", raw_stream))
    log = build_logger(settings.log_level, settings.log_format, sink or raw_stream)
    drain = Drain()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        flusher = asyncio.create_task(_flush_logs(sink)) if sink is not None else None
        try:
            async with running_services(settings, secrets, log, drain) as services:
                # For what runs outside a request (the HTTP server's wire-rejection hook) and
                # for tests; handlers get theirs from the lifespan state.
                app.state.services = services
                with sigterm_drain(drain, settings.shutdown_grace_s, log):
                    yield {"services": services}
        except SettingsError as exc:
            # Start-up refused (a pepper that does not match this Redis's): said once, plainly.
            app.state.startup_error = str(exc)
            log.error("startup_refused", error=str(exc))
            raise
        finally:
            if flusher is not None:
                flusher.cancel()
                await asyncio.gather(flusher, return_exceptions=True)
            if sink is not None:
                sink.flush_now()

    app = Starlette(
        routes=[
            *openai.routes,
            *admin.routes,
            *usage.routes,
            *policy.routes,
            *dashboard.routes,
            *ops.routes,
        ],
        lifespan=lifespan,
        # The exchange middleware is outermost: it sees every status sent, and it is the
        # catch-all that turns an unexpected exception into the 500 envelope.
        middleware=[Middleware(ExchangeMiddleware), Middleware(DrainMiddleware, drain=drain)],
        exception_handlers={
            HTTPException: _render_http_exception,
            ClientDisconnect: _client_gone,
        },
    )
    app.state.settings = settings
    app.state.secrets = secrets
    app.state.startup_error = None
    # For http_guard's on_reject: requests the server refuses before the app sees them.
    app.state.record_wire_rejection = functools.partial(record_wire_rejection, app.state)
    return app


def create_app_from_env() -> Starlette:
    """Factory for ``uvicorn --factory gateway.app:create_app_from_env`` (several workers)."""
    return create_app()
