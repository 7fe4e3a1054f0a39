"""The app factory: ``create_app(settings)`` builds a Starlette app whose lifespan owns every part.

Nothing lives in module globals: the lifespan runs the services (``gateway.services``: Redis,
the policy, keys, limits, routing, providers, the engine), hands them to the handlers through
the lifespan state (with the OpenAPI document of the routes, built on first request), and
stops them again in reverse order. Around the routes (``gateway.api``) sit the exchange
middleware (the status each client got) and the SIGTERM drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import sys
from collections.abc import AsyncIterator, Iterator
from typing import IO, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.api.admin import (
    audit,
    dead_letters,
    keys,
    ops,
    policy,
    teams,
    tokens,
    usage,
)
from gateway.api.admin import batches as batch_admin
from gateway.api.admin import cache as cache_admin
from gateway.api.dashboard import batches as dashboard_batches
from gateway.api.dashboard import home, manage
from gateway.api.dashboard.view import DashboardRenderer
from gateway.api.http import error_response
from gateway.api.openapi import document as openapi
from gateway.api.openapi.document import OpenApiDocument
from gateway.api.request_headers import HeaderGuardMiddleware
from gateway.api.v1 import anthropic, batches, files, message_batches, openai, responses, uploads
from gateway.api.v1.batch_line import line_runner
from gateway.api.v1.native_line import PipelineNativeLines
from gateway.api.v1.pipeline import V1Pipeline
from gateway.batches.service import build_runner
from gateway.errors import GatewayError, MethodNotAllowed, NotFound, echo
from gateway.logs import LazyFlushStream, build_logger
from gateway.server.exchange import ExchangeMiddleware, record_wire_rejection, request_id_of
from gateway.server.shutdown import Drain, DrainMiddleware, sigterm_drain
from gateway.server.tasks import cancel_until_done
from gateway.services import Services, running_services
from gateway.settings import Settings, SettingsError, ensure_secrets, load_settings

# New objects between two collections of the youngest generation while serving (_startup_frozen)
YOUNG_GENERATION_THRESHOLD = 10_000


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
    pages = DashboardRenderer()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        flusher = asyncio.create_task(_flush_logs(sink)) if sink is not None else None
        try:
            async with running_services(settings, secrets, log, drain, pages) as services:
                v1 = V1Pipeline(services)
                async with running_batches(services, v1):
                    # For what runs outside a request (the HTTP server's wire-rejection hook)
                    # and for tests; handlers get theirs from the lifespan state.
                    app.state.services = services
                    with sigterm_drain(drain, settings.shutdown_grace_s, log), _startup_frozen():
                        yield {
                            "services": services,
                            "v1": v1,
                            "openapi": OpenApiDocument(app.routes),
                        }
        except SettingsError as exc:
            # Start-up refused (a pepper that does not match this Redis's): said once, plainly.
            app.state.startup_error = str(exc)
            log.error("startup_refused", error=str(exc))
            raise
        finally:
            if flusher is not None:
                await cancel_until_done([flusher])
            if sink is not None:
                sink.flush_now()

    app = Starlette(
        routes=[
            *openai.routes,
            *anthropic.routes,
            *responses.routes,
            *uploads.routes,
            *files.routes,
            *batches.routes,
            *message_batches.routes,
            *keys.routes,
            *batch_admin.routes,
            *teams.routes,
            *tokens.routes,
            *audit.routes,
            *usage.routes,
            *dead_letters.routes,
            *cache_admin.routes,
            *policy.routes,
            *home.routes,
            *manage.routes,
            *dashboard_batches.routes,
            *ops.routes,
            *openapi.routes,
        ],
        lifespan=lifespan,
        # The exchange middleware is outermost: it sees every status sent, and it is the
        # catch-all that turns an unexpected exception into the 500 envelope.
        # Unknown x-switchyard-* request headers are refused before anything reads the request.
        middleware=[
            Middleware(ExchangeMiddleware),
            Middleware(DrainMiddleware, drain=drain),
            Middleware(HeaderGuardMiddleware),
        ],
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


@contextlib.asynccontextmanager
async def running_batches(services: Services, v1: V1Pipeline) -> AsyncIterator[None]:
    """The batch runner, its lines run through this app's /v1 pipeline
    (``api/v1/batch_line.py``), or a provider's batch API and booked through it
    (``api/v1/native_line.py``); none with ``SWITCHYARD_RUN_BATCHES=false``."""
    if not services.batches.settings.run:
        yield
        return
    runner = build_runner(
        services.batches,
        line_runner(v1),
        PipelineNativeLines(v1, result_cap=services.batches.settings.native_result_bytes),
        limiter=services.limiter,
        keys=services.keys,
        teams=services.teams,
        local_engine=services.local_engine,
        policies=services.policies,
        log=services.log,
    )
    await runner.start()
    try:
        yield
    finally:
        await runner.stop()


@contextlib.contextmanager
def _startup_frozen() -> Iterator[None]:
    """While serving, what start-up built (settings, policy, services, imported modules) is
    kept out of the cyclic collector's full passes: it lives as long as the process, and
    walking it again on every full pass cost 13-16 % of the c64 throughput and doubled its p99
    (docs/benchmarks.md). Garbage is collected first, so only live objects are frozen; they
    are handed back to the collector when serving ends.

    The youngest generation is collected after 10,000 new objects instead of 700: a request
    leaves no cycle behind (tests/server/test_server_request_cycles.py), so the collector has
    little to find, and at 700 it ran every few requests only to walk the objects of the
    requests in flight (1.6 s of 42 s of the gateway's CPU in a bench run; 0.04 s at 10,000)."""
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
