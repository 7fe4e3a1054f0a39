"""``GET /openapi.json``: an OpenAPI 3.1 description of every endpoint, /v1 and /admin.

Paths, methods, parameters, request bodies and responses are written here next to each
other; the schemas live in ``openapi_schemas``, the parts operations are built from in
``openapi_operations``, and the front doors beside Chat Completions in ``openapi_doors``. Errors are OpenAI's envelope (``Error``), Anthropic's on /v1/messages.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.api.http import json_response
from gateway.api.openapi.dead_letters import SCHEMAS as DEAD_LETTER_SCHEMAS
from gateway.api.openapi.dead_letters import dead_letter_paths
from gateway.api.openapi.doors import DOOR_SCHEMAS, door_paths
from gateway.api.openapi.governance import SCHEMAS as GOVERNANCE_SCHEMAS
from gateway.api.openapi.governance import governance_paths
from gateway.api.openapi.operations import (
    ADMIN_ERRORS,
    DAY,
    JSON,
    V1_ERRORS,
    Operation,
    admin,
    csv_report,
    error_responses,
    json_content,
    query,
    record_admin,
)
from gateway.api.openapi.schemas import GROUP_BYS, MAX_EVENTS_LIMIT, SCHEMAS, STRING, ref
from gateway.services import Services


def _v1_post(summary: str, body: str, ok: str, streamable: bool) -> Operation:
    ok_content = json_content(ref(ok))
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
        "requestBody": {"required": True, "content": json_content(ref(body))},
        "responses": {"200": {"description": "the answer", "content": ok_content}}
        | error_responses(*V1_ERRORS),
    }


KEY_ID = {
    "name": "key_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "the key's id (as returned by create)",
}
CACHE_FILTERS = [
    query("model", {"type": "string", "minLength": 1, "maxLength": 1000}, "a canonical model"),
    query("team", {"type": "string", "minLength": 1, "maxLength": 200}),
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
                "parameters": [
                    {
                        "name": "available",
                        "in": "query",
                        "required": False,
                        "description": "true: only the models that can be served now; false: "
                        "only the others",
                        "schema": {"type": "string", "enum": ["true", "false"]},
                    }
                ],
                "responses": {
                    "200": {"description": "the models", "content": json_content(ref("ModelList"))}
                }
                | error_responses(400, 401, 503),
            }
        },
        **door_paths(),
        "/v1/usage": {
            "get": {
                "summary": "The calling key's own usage over the last days",
                "tags": ["v1"],
                "security": [{"apiKey": []}],
                "parameters": [
                    query("days", {"type": "integer", "minimum": 1, "maximum": 400}),
                    query("group_by", {"enum": ["tag", "user"]}),
                ],
                "responses": {
                    "200": {"description": "usage", "content": json_content(ref("KeyUsage"))}
                }
                | error_responses(400, 401, 503),
            }
        },
        "/admin/keys": {
            "post": admin("Create a key", "KeyWithSecret", status="201", body="KeyCreate"),
            "get": admin(
                "List keys",
                "KeyList",
                params=[
                    query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
                    query(
                        "after",
                        {"type": "string", "maxLength": 200},
                        "the last id of the previous page",
                    ),
                    query("team", {"type": "string", "maxLength": 200}),
                    query("status", {"enum": ["active", "revoked", "expired"]}),
                ],
            ),
        },
        "/admin/keys/{key_id}": {
            "get": record_admin("Show a key", "Key", KEY_ID),
            "patch": record_admin(
                "Change a key's fields (null clears one)", "Key", KEY_ID, body="KeyUpdate"
            ),
        },
        "/admin/keys/{key_id}/rotate": {
            "post": record_admin(
                "Issue a new secret; the old one stays valid for grace_seconds",
                "KeyWithSecret",
                KEY_ID,
                409,
                body="RotateRequest",
                headers=[
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string", "minLength": 1, "maxLength": 200},
                    },
                ],
            )
        },
        "/admin/keys/{key_id}/revoke": {"post": record_admin("Revoke a key", "Key", KEY_ID)},
        **governance_paths(),
        "/admin/usage": {
            "get": csv_report(
                "Usage grouped by one dimension over a date range",
                "UsageReport",
                [
                    query("from", DAY, "YYYY-MM-DD, UTC; default 30 days before to"),
                    query("to", DAY, "YYYY-MM-DD, UTC; default today"),
                    query("group_by", {"enum": list(GROUP_BYS)}),
                ],
            )
        },
        "/admin/usage/events": {
            "get": admin(
                "Raw usage events, newest first",
                "UsageEvents",
                params=[
                    query("key", {"type": "string", "maxLength": 200}, "a key id"),
                    query("model", {"type": "string", "maxLength": 1000}),
                    query("cursor", {"type": "string", "maxLength": 1000}),
                    query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_EVENTS_LIMIT}),
                ],
            )
        },
        **dead_letter_paths(),
        "/admin/cache": {
            "get": admin("Response cache stats, per scope", "CacheStats", params=CACHE_FILTERS),
            "delete": admin(
                "Purge cached answers of a model and/or team (or all=true)",
                "CachePurged",
                params=[*CACHE_FILTERS, query("all", {"type": "boolean"}, "purge every entry")],
            ),
        },
        "/admin/policy": {
            "get": admin(
                "The policy in force (format=yaml, admin role: the YAML text in force)",
                None,
                params=[query("format", {"enum": ["json", "yaml"]})],
                ok_content=json_content(ref("PolicyState"))
                # The file's text: a YAML mapping (what a YAML reader of the answer finds).
                | {"application/yaml": {"schema": {"type": "object"}}},
            ),
            "put": admin(
                "Replace the policy (validated, written, applied)",
                "PolicyApplied",
                errors=(*ADMIN_ERRORS, 413),
            )
            | {"requestBody": {"required": True, "content": POLICY_BODY}},
        },
        "/admin/policy/validate": {
            "post": admin(
                "Validate a policy without applying it", "PolicyValid", errors=(*ADMIN_ERRORS, 413)
            )
            | {"requestBody": {"required": True, "content": POLICY_BODY}}
        },
        "/admin/route/explain": {
            "post": admin(
                "The candidates a request would be routed to, with reasons",
                "RouteExplanation",
                body="ExplainRequest",
            )
        },
        "/admin/health": {
            "get": admin(
                "Readiness checks with details (policy error, engine error)", "AdminHealth"
            )
        },
        "/healthz": {
            "get": {
                "summary": "Liveness",
                "tags": ["ops"],
                "responses": {
                    "200": {"description": "alive", "content": json_content(ref("Health"))}
                },
            }
        },
        "/readyz": {
            "get": {
                "summary": "Readiness (states only): Redis reachable, policy loaded, not draining",
                "tags": ["ops"],
                "responses": {
                    "200": {"description": "ready", "content": json_content(ref("Readiness"))},
                    "503": {"description": "not ready", "content": json_content(ref("Readiness"))},
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
                | error_responses(401),
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "tags": ["ops"],
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1",
                        "content": json_content({"type": "object"}),
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
            "schemas": SCHEMAS | DOOR_SCHEMAS | GOVERNANCE_SCHEMAS | DEAD_LETTER_SCHEMAS,
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
