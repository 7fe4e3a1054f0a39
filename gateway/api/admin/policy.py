"""Admin endpoints for the routing policy and route explanations (``Guard.ADMIN``; replacing
the policy needs the ``admin`` role, reading, validating and explaining ``operator``):

- ``GET  /admin/policy``           version, loaded_at, source, last_error and the policy as JSON
                                    (providers' header values masked below the admin role);
                                    ``?format=yaml`` (admin role): the YAML text in force
- ``PUT  /admin/policy``           YAML or JSON body: validate, write the file atomically, apply
- ``POST /admin/policy/validate``  the same validation, a dry run
- ``POST /admin/route/explain``    ``{"body": {...}, "headers": {...}, "key_id"?, "allowed_models"?}``
                                    (``"operation"``: what the door asks, default ``chat``)
                                    → the ordered candidates with reasons, each one's health,
                                    ``would_serve`` (the first the dispatcher would try now) and
                                    its route header; for an engine fleet, the replica it would
                                    pick and why, and its replicas (``fleets``); calls no provider
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal, NotRequired, TypedDict

import msgspec
from pydantic import BaseModel, ConfigDict, Field, StrictStr
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.access.admins import Actor
from gateway.api.admin.audit import record_action
from gateway.api.endpoint import Guard, endpoint
from gateway.api.http import json_response, read_body, read_json_object
from gateway.api.payloads import parse_payload
from gateway.api.request_headers import check_headers
from gateway.api.v1.validation import validate_routed
from gateway.errors import InvalidRequest, PermissionDenied, clip
from gateway.policy import PolicyError
from gateway.policy.operations import Operation
from gateway.policy.store import policy_body
from gateway.routing.router import PlanExplanation, RoutePlan
from gateway.services import Services

# Read limit of the body (413 past it); the policy's own bound (policy.MAX_POLICY_BYTES, a 400
# naming it) is smaller.
MAX_POLICY_BODY_BYTES = 1 << 20
MAX_EXPLAIN_BYTES = 1 << 20


class PolicyApplied(TypedDict):
    applied: Literal[True]
    version: str
    loaded_at: float


class PolicyValid(TypedDict):
    valid: Literal[True]
    models: int
    tasks: list[str]
    current_version: str | None


class RouteExplanation(PlanExplanation):
    """A plan, and what the dispatcher would do with it now."""

    health: list[dict[str, Any]]
    would_serve: str | None
    header: str
    fleets: NotRequired[
        Annotated[
            dict[str, dict[str, Any]],
            msgspec.Meta(
                description="engine fleets among the candidates: provider -> the replica it "
                "would pick now (pick, header) and its replicas"
            ),
        ]
    ]


def _invalid_policy(error: PolicyError) -> InvalidRequest:
    # The path and message may quote names from the body: cut them short.
    return InvalidRequest(
        f"invalid policy: {clip(str(error), 500)}",
        param=clip(error.path, 200) or None,
        code="invalid_policy",
    )


async def get_policy(request: Request, services: Services, actor: Actor) -> Response:
    shape = request.query_params.get("format", "json")
    if shape == "json":
        # Header values may be credentials: only the admin role, who may replace the policy
        # anyway, sees them; an operator sees that they exist (and which variable names one).
        return json_response(services.policies.describe(reveal_headers=actor.may("admin")))
    if shape != "yaml":
        raise InvalidRequest("format: expected json or yaml", param="format")
    # The file as written may hold what the JSON view masks: the admin role only.
    if not actor.may("admin"):
        raise PermissionDenied(
            f"format=yaml needs the admin role; this credential has the {actor.role} role.",
            code="insufficient_role",
        )
    loaded = services.policies.current
    return Response(
        loaded.text,
        media_type="application/yaml",
        headers={"X-Policy-Version": loaded.version},
    )


async def put_policy(request: Request, services: Services, actor: Actor) -> Response:
    store = services.policies
    before = store.current.version if store.loaded else None
    try:
        raw = await read_body(request, MAX_POLICY_BODY_BYTES)
        content_type = request.headers.get("content-type")
        # Parsing is CPU work (a large document takes seconds): never on the event loop.
        body = await asyncio.to_thread(policy_body, raw, content_type)
        loaded = await asyncio.to_thread(store.write_body, body)
    except PolicyError as error:
        raise _invalid_policy(error) from None
    # The versions only: a policy may name provider settings an audit reader need not see.
    await record_action(
        services, request, actor, "policy.put", "policy",
        before={"version": before}, after={"version": loaded.version},
    )  # fmt: skip
    return json_response(
        PolicyApplied(applied=True, version=loaded.version, loaded_at=loaded.loaded_at)
    )


async def validate_policy(request: Request, services: Services, actor: Actor) -> Response:
    store = services.policies
    try:
        raw = await read_body(request, MAX_POLICY_BODY_BYTES)
        content_type = request.headers.get("content-type")
        body = await asyncio.to_thread(policy_body, raw, content_type)
        policy = await asyncio.to_thread(body.parse)
    except PolicyError as error:
        raise _invalid_policy(error) from None
    return json_response(
        PolicyValid(
            valid=True,
            models=len(policy.models),
            tasks=sorted(policy.tasks),
            current_version=store.current.version if store.loaded else None,
        )
    )


async def explain_route(request: Request, services: Services, actor: Actor) -> Response:
    payload = await read_json_object(request, MAX_EXPLAIN_BYTES)
    body, headers, key_id, allowed, operation = _explain_inputs(payload)
    plan = services.router.plan(
        body=body, headers=headers, key_id=key_id, allowed_models=allowed, operation=operation
    )
    health = services.dispatcher.preview(plan)
    # The first candidate the dispatcher would try now; the header it would get if it serves.
    would_serve = next(
        (c for c, row in zip(plan.candidates, health, strict=True) if _would_try(row)), None
    )
    header = plan.header_value(would_serve or plan.candidates[0])
    fleets = _fleet_previews(services, plan, body)
    served_fleet = fleets.get(would_serve.provider) if would_serve else None
    if served_fleet is not None and served_fleet["header"]:
        header += "; " + served_fleet["header"]
    explained = RouteExplanation(
        **plan.explain(),
        health=health,
        would_serve=would_serve.model if would_serve else None,
        header=header,
    )
    if fleets:
        explained["fleets"] = fleets
    return json_response(explained)


def _fleet_previews(
    services: Services, plan: RoutePlan, body: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """For each engine fleet among the candidates: the replica it would pick for this body
    now (nothing committed) and every replica's state."""
    if plan.policy is None:
        return {}
    previews: dict[str, dict[str, Any]] = {}
    for candidate in plan.candidates:
        config = plan.policy.providers.get(candidate.provider)
        if config is None or candidate.provider in previews:
            continue
        routed = {**body, "model": candidate.upstream_model}  # what the replica is sent
        preview = services.fleets.preview(candidate.provider, config, routed)
        if preview is not None:
            previews[candidate.provider] = preview
    return previews


def _would_try(row: dict[str, Any]) -> bool:
    return str(row.get("verdict", "")).startswith("would try")


class ExplainRequest(BaseModel):
    """``POST /admin/route/explain``: a /v1 body to route, as a request would be."""

    model_config = ConfigDict(extra="forbid")
    body: dict[StrictStr, Any] = Field(
        default_factory=dict,
        description="the /v1 request body to route; the fields routing reads are checked as "
        "a /v1 request checks them",
    )
    headers: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    key_id: Annotated[StrictStr, Field(max_length=200)] = "explain"
    allowed_models: list[StrictStr] | None = None
    operation: Operation = Field(
        "chat",
        description="the operation of the door the body would be sent to (chat: the chat "
        "doors): a pinned model that does not serve it is a 404 model_not_supported",
    )


def _explain_inputs(
    payload: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, str], str, frozenset[str] | None, str]:
    request = parse_payload(ExplainRequest, payload)
    # The fields routing reads are checked as a /v1 request would check them; the body itself
    # is routed as sent.
    body = payload.get("body", {})
    validate_routed(body, prefix="body")
    check_headers(request.headers, where="headers.")  # a typo would be explained away
    allowed = request.allowed_models
    return (
        body,
        request.headers,
        request.key_id,
        frozenset(allowed) if allowed is not None else None,
        request.operation,
    )


routes = [
    Route("/admin/policy", endpoint(get_policy, Guard.ADMIN, "operator"), methods=["GET"]),
    Route("/admin/policy", endpoint(put_policy, Guard.ADMIN, "admin"), methods=["PUT"]),
    Route(
        "/admin/policy/validate",
        endpoint(validate_policy, Guard.ADMIN, "operator"),
        methods=["POST"],
    ),
    Route(
        "/admin/route/explain", endpoint(explain_route, Guard.ADMIN, "operator"), methods=["POST"]
    ),
]
