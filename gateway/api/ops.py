"""Operations endpoints: liveness, readiness (Redis reachable, policy loaded, not draining),
Prometheus, and the OpenAPI document."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api.http import json_response
from gateway.api.openapi import openapi_json
from gateway.api.services import Services
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
    return json_response(
        {"status": "ready" if ready else "not ready", "checks": checks},
        status=200 if ready else 503,
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
