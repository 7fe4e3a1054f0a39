"""``GET /openapi.json``: an OpenAPI 3.1 description of every endpoint, /v1 and /admin.

Paths, methods, parameters, request bodies and responses are written here next to each
other; the schemas live in ``openapi_schemas``, and the front doors beside Chat Completions in
``openapi_doors``. Errors are OpenAI's envelope (``Error``), Anthropic's on /v1/messages.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.api.http import json_response
from gateway.api.openapi_doors import DOOR_SCHEMAS, door_paths
from gateway.api.openapi_governance import SCHEMAS as GOVERNANCE_SCHEMAS
from gateway.api.openapi_governance import governance_paths
from gateway.api.openapi_schemas import GROUP_BYS, MAX_EVENTS_LIMIT, SCHEMAS, STRING, ref
from gateway.services import Services

JSON = "application/json"
Operation = dict[str, Any]


def _json_content(schema: dict[str, Any]) -> dict[str, Any]:
    return {JSON: {"schema": schema}}


def _errors(*statuses: int) -> dict[str, Any]:
    reasons = {
        400: "invalid request (names the field in error.param)",
        401: "missing or unknown credentials",
        403: "the key may not do this",
        404: "no such resource or model",
        408: "the request did not arrive in time",
        409: "conflict",
        413: "body too large",
        429: "rate limit or budget exceeded, or too many failed admin credentials",
        431: "headers too large",
        502: "upstream failed",
        503: "Redis, policy or upstream unavailable, or the gateway is shutting down",
        504: "upstream timed out",
    }
    return {
        str(status): {"description": reasons[status], "content": _json_content(ref("Error"))}
        for status in statuses
    }


V1_ERRORS = (400, 401, 403, 404, 413, 429, 502, 503, 504)
ADMIN_ERRORS = (400, 401, 403, 429, 503)


def _v1_post(summary: str, body: str, ok: str, streamable: bool) -> Operation:
    ok_content = _json_content(ref(ok))
    if streamable:
        # One server-sent event: data is a JSON chunk, then "[DONE]"; event "error" on failure.
        ok_content["text/event-stream"] = {
            "schema": {
                "type": "object",
                "properties": {"event": {"enum": ["message", "error"]}, "data": STRING},
                "required": ["data"],
            }
        }
    return {
        "summary": summary,
        "tags": ["v1"],
        "security": [{"apiKey": []}],
        "requestBody": {"required": True, "content": _json_content(ref(body))},
        "responses": {"200": {"description": "the answer", "content": ok_content}}
        | _errors(*V1_ERRORS),
    }


def _admin(
    summary: str,
    ok: str | None,
    *,
    status: str = "200",
    body: str | None = None,
    params: list[dict[str, Any]] | None = None,
    errors: tuple[int, ...] = ADMIN_ERRORS,
    ok_content: dict[str, Any] | None = None,
) -> Operation:
    operation: Operation = {
        "summary": summary,
        "tags": ["admin"],
        "security": [{"adminKey": []}],
        "responses": {
            status: {
                "description": "ok",
                "content": ok_content if ok_content is not None else _json_content(ref(ok or "")),
            }
        }
        | _errors(*errors),
    }
    if body is not None:
        operation["requestBody"] = {"required": True, "content": _json_content(ref(body))}
        operation["responses"] |= _errors(413)  # a body over the size limit
    if params:
        operation["parameters"] = params
    return operation


def _query(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema} | (
        {"description": description} if description else {}
    )


KEY_ID = {
    "name": "key_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "the key's id (as returned by create)",
}
DAY = {"type": "string", "format": "date", "pattern": r"^\d{4}-\d{2}-\d{2}$"}
CACHE_FILTERS = [
    _query("model", {"type": "string", "minLength": 1, "maxLength": 1000}, "a canonical model"),
    _query("team", {"type": "string", "minLength": 1, "maxLength": 200}),
]
POLICY_BODY = {
    JSON: {"schema": {"type": "object", "description": "the policy as JSON"}},
    "application/yaml": {"schema": {"type": "string", "description": "the policy as YAML"}},
}


def openapi_document(version: str = "1") -> dict[str, Any]:
    paths: dict[str, Any] = {
        "/v1/chat/completions": {
            "post": _v1_post("Chat completion", "ChatCompletionRequest", "ChatCompletion", True)
        },
        "/v1/completions": {
            "post": _v1_post("Text completion", "CompletionRequest", "ChatCompletion", True)
        },
        "/v1/embeddings": {
            "post": _v1_post("Embeddings", "EmbeddingRequest", "EmbeddingList", False)
        },
        "/v1/images/generations": {
            "post": _v1_post("Image generation", "ImageRequest", "ImageList", False)
        },
        "/v1/models": {
            "get": {
                "summary": "Models and aliases this key may use",
                "tags": ["v1"],
                "security": [{"apiKey": []}],
                "responses": {
                    "200": {"description": "the models", "content": _json_content(ref("ModelList"))}
                }
                | _errors(401, 503),
            }
        },
        **door_paths(),
        "/v1/usage": {
            "get": {
                "summary": "The calling key's own usage over the last days",
                "tags": ["v1"],
                "security": [{"apiKey": []}],
                "parameters": [
                    _query("days", {"type": "integer", "minimum": 1, "maximum": 400}),
                    _query("group_by", {"enum": ["tag", "user"]}),
                ],
                "responses": {
                    "200": {"description": "usage", "content": _json_content(ref("KeyUsage"))}
                }
                | _errors(400, 401, 503),
            }
        },
        "/admin/keys": {
            "post": _admin("Create a key", "KeyWithSecret", status="201", body="KeyCreate"),
            "get": _admin(
                "List keys",
                "KeyList",
                params=[
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
                    _query(
                        "after",
                        {"type": "string", "maxLength": 200},
                        "the last id of the previous page",
                    ),
                    _query("team", {"type": "string", "maxLength": 200}),
                    _query("status", {"enum": ["active", "revoked", "expired"]}),
                ],
            ),
        },
        "/admin/keys/{key_id}": {
            "get": _admin("Show a key", "Key", params=[KEY_ID], errors=(*ADMIN_ERRORS, 404)),
            "patch": _admin(
                "Change a key's fields (null clears one)",
                "Key",
                body="KeyUpdate",
                params=[KEY_ID],
                errors=(*ADMIN_ERRORS, 404),
            ),
        },
        "/admin/keys/{key_id}/rotate": {
            "post": _admin(
                "Issue a new secret; the old one stays valid for grace_seconds",
                "KeyWithSecret",
                body="RotateRequest",
                params=[
                    KEY_ID,
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string", "minLength": 1, "maxLength": 200},
                    },
                ],
                errors=(*ADMIN_ERRORS, 404, 409),
            )
        },
        "/admin/keys/{key_id}/revoke": {
            "post": _admin("Revoke a key", "Key", params=[KEY_ID], errors=(*ADMIN_ERRORS, 404))
        },
        **governance_paths(_admin, _query, ADMIN_ERRORS, DAY),
        "/admin/usage": {
            "get": _admin(
                "Usage grouped by one dimension over a date range",
                None,
                params=[
                    _query("from", DAY, "YYYY-MM-DD, UTC; default 30 days before to"),
                    _query("to", DAY, "YYYY-MM-DD, UTC; default today"),
                    _query("group_by", {"enum": list(GROUP_BYS)}),
                    _query("format", {"enum": ["json", "csv"]}),
                ],
                ok_content=_json_content(ref("UsageReport"))
                | {"text/csv": {"schema": {"type": "string"}}},
            )
        },
        "/admin/usage/events": {
            "get": _admin(
                "Raw usage events, newest first",
                "UsageEvents",
                params=[
                    _query("key", {"type": "string", "maxLength": 200}, "a key id"),
                    _query("model", {"type": "string", "maxLength": 1000}),
                    _query("cursor", {"type": "string", "maxLength": 1000}),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_EVENTS_LIMIT}),
                ],
            )
        },
        "/admin/cache": {
            "get": _admin("Response cache stats, per scope", "CacheStats", params=CACHE_FILTERS),
            "delete": _admin(
                "Purge cached answers of a model and/or team (or all=true)",
                "CachePurged",
                params=[*CACHE_FILTERS, _query("all", {"type": "boolean"}, "purge every entry")],
            ),
        },
        "/admin/policy": {
            "get": _admin("The policy in force", "PolicyState"),
            "put": _admin(
                "Replace the policy (validated, written, applied)",
                "PolicyApplied",
                errors=(*ADMIN_ERRORS, 413),
            )
            | {"requestBody": {"required": True, "content": POLICY_BODY}},
        },
        "/admin/policy/validate": {
            "post": _admin(
                "Validate a policy without applying it", "PolicyValid", errors=(*ADMIN_ERRORS, 413)
            )
            | {"requestBody": {"required": True, "content": POLICY_BODY}}
        },
        "/admin/route/explain": {
            "post": _admin(
                "The candidates a request would be routed to, with reasons",
                "RouteExplanation",
                body="ExplainRequest",
            )
        },
        "/admin/health": {
            "get": _admin(
                "Readiness checks with details (policy error, engine error)", "AdminHealth"
            )
        },
        "/healthz": {
            "get": {
                "summary": "Liveness",
                "tags": ["ops"],
                "responses": {
                    "200": {"description": "alive", "content": _json_content(ref("Health"))}
                },
            }
        },
        "/readyz": {
            "get": {
                "summary": "Readiness (states only): Redis reachable, policy loaded, not draining",
                "tags": ["ops"],
                "responses": {
                    "200": {"description": "ready", "content": _json_content(ref("Readiness"))},
                    "503": {"description": "not ready", "content": _json_content(ref("Readiness"))},
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (bearer SWITCHYARD_METRICS_TOKEN when set)",
                "tags": ["ops"],
                "responses": {
                    "200": {
                        "description": "text exposition format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                }
                | _errors(401),
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "tags": ["ops"],
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1",
                        "content": _json_content({"type": "object"}),
                    }
                },
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Switchyard",
            "version": version,
            "description": "LLM gateway: /v1 for applications (API key: OpenAI's and "
            "Anthropic's APIs), /admin for operators (admin key or admin token). Errors use "
            "OpenAI's envelope, and Anthropic's on /v1/messages.",
        },
        "paths": paths,
        "components": {
            "schemas": SCHEMAS | DOOR_SCHEMAS | GOVERNANCE_SCHEMAS,
            "securitySchemes": {
                "apiKey": {"type": "http", "scheme": "bearer", "description": "sk-sy-... key"},
                "anthropicKey": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "x-api-key",
                    "description": "the same sk-sy-... key, as Anthropic's SDKs send it",
                },
                "adminKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "the admin key, or a named admin token (sy-tok-...) whose "
                    "role reaches the operation's: viewer (usage reports), operator (keys, "
                    "teams, reading the policy), admin (everything)",
                },
            },
        },
    }


async def openapi_json(request: Request, services: Services) -> Response:
    return json_response(openapi_document())
