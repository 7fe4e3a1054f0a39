"""Operations endpoints: liveness, readiness (Redis reachable, policy loaded, not draining),
Prometheus, and the OpenAPI document.

The local engine shows in ``checks.local_engine`` (ready, loading, ``failed: <load error>``,
``unhealthy: <why>``). A broken engine makes the gateway unready only when no upstream provider
of the policy could serve instead (none configured, or none with its API key set): while one
can, routing skips the engine and this replica keeps its traffic.
"""

from __future__ import annotations

import asyncio
import os

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api.http import json_response
from gateway.api.openapi import openapi_json
from gateway.api.services import Services
from gateway.policy import Policy
from gateway.redis_connect import REDIS_FAILURES


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request) -> Response:
    services: Services = request.app.state.services
    try:
        redis_ok = bool(await asyncio.wait_for(services.redis.ping(), timeout=1.0))
    except REDIS_FAILURES:
        redis_ok = False
    services.metrics.redis_up.set(1 if redis_ok else 0)
    policies = services.policies
    policy_ok = policies.loaded
    checks = {
        "redis": "ok" if redis_ok else "unreachable",
        "policy": (f"ok (version {policies.current.version})" if policy_ok else "not loaded"),
    }
    if policies.last_error is not None:
        checks["policy_last_error"] = str(policies.last_error)
    draining = request.app.state.drain.draining
    if draining:
        checks["shutdown"] = "draining"
    ready = redis_ok and policy_ok and not draining
    local = services.local_engine
    health = local.health() if local is not None else None
    if health is not None and health.state != "absent":
        checks["local_engine"] = health.describe()
        if (
            health.state != "ready"
            and policy_ok
            and not _upstream_can_serve(policies.current.policy)
        ):
            ready = False  # the engine was the only way to answer
    return json_response(
        {"status": "ready" if ready else "not ready", "checks": checks},
        status=200 if ready else 503,
    )


def _upstream_can_serve(policy: Policy) -> bool:
    """True when some non-local provider is configured with the API key it needs."""
    return any(
        provider.kind != "local"
        and (not provider.api_key_env or os.environ.get(provider.api_key_env))
        for provider in policy.providers.values()
    )


async def metrics(request: Request) -> Response:
    services: Services = request.app.state.services
    return Response(
        services.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
    )


routes = [
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/openapi.json", openapi_json, methods=["GET"]),
]
