"""Operations endpoints: liveness, readiness (Redis reachable, policy loaded, not draining),
Prometheus, and ``GET /admin/health`` (the same checks with details).

``/readyz`` needs no credentials, so it says states only (``ok``, ``unreachable``, ``failed``…):
a policy reload error or an engine load error can quote a file, and files can hold secrets.
The details are for the admin: ``GET /admin/health`` (and ``GET /admin/policy`` for the policy's
last error). ``/metrics`` asks for ``Authorization: Bearer <SWITCHYARD_METRICS_TOKEN>`` when
that is set.

The local engine shows in ``checks.local_engine`` (ready, loading, failed, unhealthy). A broken
engine makes the gateway unready only when no upstream provider of the policy could serve
instead (none configured, or none with its API key set): while one can, routing skips the engine
and this replica keeps its traffic.
"""

from __future__ import annotations

import asyncio
import hmac
import os
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.access.admins import Actor
from gateway.access.auth import bearer_token
from gateway.api.endpoint import Guard, endpoint
from gateway.api.http import error_response, json_response
from gateway.errors import AuthenticationFailed
from gateway.policy import Policy
from gateway.services import Services
from gateway.store.connect import REDIS_FAILURES


class Health(TypedDict):
    status: Literal["ok"]


class ReadinessView(TypedDict):
    """Whether this replica should get traffic, and each check's state."""

    status: Literal["ready", "not ready"]
    checks: dict[str, str]


class AdminHealth(ReadinessView):
    details: dict[str, Any]


@dataclass
class Readiness:
    ready: bool
    checks: dict[str, str]  # states only: safe for anyone to read
    details: dict[str, Any] = field(default_factory=dict)  # for the admin

    def body(self) -> ReadinessView:
        return ReadinessView(status="ready" if self.ready else "not ready", checks=self.checks)


async def healthz(request: Request, services: Services) -> Response:
    return json_response(Health(status="ok"))


async def check_readiness(services: Services, detailed: bool = False) -> Readiness:
    try:
        redis_ok = bool(await asyncio.wait_for(services.redis.ping(), timeout=1.0))
    except REDIS_FAILURES:
        redis_ok = False
    services.metrics.redis_up.set(1 if redis_ok else 0)
    policies = services.policies
    policy_ok = policies.loaded
    checks = {
        "redis": "ok" if redis_ok else "unreachable",
        "policy": "ok" if policy_ok else "not loaded",
    }
    details: dict[str, Any] = {}
    if detailed:
        state = policies.describe()
        details["policy"] = {name: state[name] for name in ("version", "source", "last_error")}
    if policies.last_error is not None:
        checks["policy_reload"] = "failed"  # the error itself: GET /admin/policy
    draining = services.drain.draining
    if draining:
        checks["shutdown"] = "draining"
    if services.key_pepper_mismatch:
        checks["key_pepper"] = "mismatch"  # see the log: SWITCHYARD_KEY_PEPPER
    ready = redis_ok and policy_ok and not draining and not services.key_pepper_mismatch
    health = services.local_engine.health()
    if health.state != "absent":
        checks["local_engine"] = health.state
        if detailed:
            details["local_engine"] = health.describe()
        if (
            health.state != "ready"
            and policy_ok
            and not _another_can_serve(services, policies.current.policy)
        ):
            ready = False  # the engine was the only way to answer
    return Readiness(ready, checks, details)


async def readyz(request: Request, services: Services) -> Response:
    readiness = await check_readiness(services)
    return json_response(readiness.body(), status=200 if readiness.ready else 503)


async def admin_health(request: Request, services: Services, actor: Actor) -> Response:
    """``GET /admin/health``: the readiness checks, and what each failure was about."""
    readiness = await check_readiness(services, detailed=True)
    return json_response(AdminHealth(**readiness.body(), details=readiness.details))


def _another_can_serve(services: Services, policy: Policy) -> bool:
    """True when some provider of the policy can take a request now and has the API key (and
    header values) it needs (the engine, not ready, cannot)."""
    return any(
        services.providers.get(name, config).unavailable() is None
        and config.missing_env(os.environ) is None
        for name, config in policy.providers.items()
    )


async def metrics(request: Request, services: Services) -> Response:
    expected = services.settings.metrics_token
    if expected is not None and expected.get_secret_value():
        token = bearer_token(request.headers.get("authorization")) or ""
        if not hmac.compare_digest(token.encode(), expected.get_secret_value().encode()):
            error = AuthenticationFailed(
                "/metrics needs 'Authorization: Bearer <SWITCHYARD_METRICS_TOKEN>'.",
                code="metrics_token_required",
            )
            return error_response(error, {"www-authenticate": "Bearer"})
    return Response(
        services.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
    )


routes = [
    Route("/healthz", endpoint(healthz, Guard.NONE), methods=["GET"]),
    Route("/readyz", endpoint(readyz, Guard.NONE), methods=["GET"]),
    Route("/metrics", endpoint(metrics, Guard.NONE), methods=["GET"]),
    Route("/admin/health", endpoint(admin_health, Guard.ADMIN, "operator"), methods=["GET"]),
]
