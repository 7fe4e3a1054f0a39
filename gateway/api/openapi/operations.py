"""What the OpenAPI document says of each operation the routes serve, keyed ``"METHOD
/path"``: a summary, the model its body and query string are validated with, what it answers
and with which error statuses. ``document.py`` walks the app's routes and builds each operation
from this; a route missing here, or an entry no route serves, is an error.

A shape is a model class (its schema is generated: msgspec Structs of
``api/v1/request_models.py``, pydantic models of the admin API, the ``TypedDict`` an answer's
builder returns), or the name of a body schema written out in ``unmodelled.py`` where no model
checks it. Parameters listed here by hand are the ones a handler reads itself (a header, ``?available=``, ``?format=`` of the policy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from gateway.access.admins import AdminTokenView
from gateway.access.key_admin import MAX_IDEMPOTENCY_KEY_CHARS
from gateway.access.key_models import KeyCreate, KeyListQuery, KeyUpdate, RotateRequest
from gateway.access.keys import KeyView
from gateway.access.team_models import TeamCreate, TeamListQuery, TeamUpdate
from gateway.access.teams import TeamView
from gateway.access.token_admin import TokenCreate, TokenListQuery
from gateway.api.admin.audit import AuditList, AuditListQuery
from gateway.api.admin.cache import CachePurged, CacheQuery, PurgeQuery
from gateway.api.admin.dead_letters import DeadLetterListQuery, ReplayRequest
from gateway.api.admin.keys import IssuedKey, KeyList
from gateway.api.admin.ops import AdminHealth, Health, ReadinessView
from gateway.api.admin.policy import ExplainRequest, PolicyApplied, PolicyValid, RouteExplanation
from gateway.api.admin.teams import CreatedTeam, TeamDeleted, TeamList, TeamWithUsage
from gateway.api.admin.tokens import AdminTokenList, IssuedAdminToken
from gateway.api.admin.usage import AdminUsageQuery, OwnUsageQuery, UsageEventsQuery
from gateway.api.v1.openai import ImageList, Model, ModelList, Moderation
from gateway.api.v1.request_models import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    ImageRequest,
    ModerationRequest,
    SpeechRequest,
)
from gateway.api.v1.uploads import Transcription
from gateway.cache.stats import CacheStatsView
from gateway.formats.anthropic_messages.response import AnthropicMessage, TokenCount
from gateway.formats.openai_chat.response import ChatCompletion
from gateway.formats.openai_embeddings import EmbeddingList
from gateway.formats.openai_responses.response import ResponseObject
from gateway.metering.dead_letters import DeadLetterList, DeadLettersReplayed
from gateway.metering.reports import KeyUsage, UsageEvents, UsageReport
from gateway.policy.store import PolicyState

JSON = "application/json"
SSE = "text/event-stream"
# A shape: a model class, the name of a schema in unmodelled.py, or a schema.
Shape = type | str | dict[str, Any]
Content = dict[str, Shape]

ERROR_REASONS = {
    400: "invalid request (error.param names the field)",
    401: "missing or unknown credentials",
    403: "the key may not do this",
    404: "no such model, or one that does not serve this operation (model_not_supported)",
    409: "a batch that cannot be cancelled or deleted in its status",
    413: "body too large",
    429: "rate limit or budget exceeded",
    502: "upstream failed",
    503: "Redis, policy or upstream unavailable, or the gateway is shutting down",
    504: "upstream timed out",
}
ADMIN_ERROR_REASONS = ERROR_REASONS | {
    403: "an unknown credential, or one whose role is too low (insufficient_role)",
    404: "no such record",
    409: "conflict",
    429: "too many failed admin credentials from this address",
}
V1_ERRORS = (400, 401, 403, 404, 413, 429, 502, 503, 504)
ADMIN_ERRORS = (400, 401, 403, 429, 503)
RECORD_ERRORS = (*ADMIN_ERRORS, 404)  # an admin operation on a record the path names


@dataclass(frozen=True)
class Operation:
    summary: str
    answer: Content
    body: Content | None = None
    query: type[BaseModel] | None = None
    parameters: tuple[dict[str, Any], ...] = ()
    errors: tuple[int, ...] | None = None  # None: an admin operation's ADMIN_ERRORS, else none
    status: int = 200
    # Other answers than errors: status -> (description, content).
    also: dict[int, tuple[str, Content]] = field(default_factory=dict)


def json(shape: Shape) -> Content:
    return {JSON: shape}


def streamed(shape: Shape, events: dict[str, Any] | None = None) -> Content:
    """``shape`` as JSON, or with ``stream: true`` as server-sent events whose ``data`` is a
    JSON chunk (OpenAI's end with ``[DONE]``, and are named ``error`` on failure)."""
    event = {
        "type": "object",
        "properties": {"event": events or {"type": "string"}, "data": {"type": "string"}},
        "required": ["data"],
    }
    return {JSON: shape, SSE: event}


OPENAI_EVENTS = {"enum": ["message", "error"]}


def with_csv(shape: Shape) -> Content:
    """A report: ``shape`` as JSON, or CSV text with ``format=csv``."""
    return {JSON: shape, "text/csv": {"type": "string"}}


def v1(summary: str, body: Shape, answer: Content, media_type: str = JSON) -> Operation:
    return Operation(summary, answer, body={media_type: body}, errors=V1_ERRORS)


def upload(what: str, answer: Content) -> Operation:
    """A multipart upload passed through to the provider, its answer streamed back."""
    summary = f"{what} of an upload, streamed through"
    return v1(summary, "Upload", answer, "multipart/form-data")


def header(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "schema": schema}


def query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema} | {
        "description": description
    }


POLICY_BODY: Content = {
    JSON: {"type": "object", "description": "the policy as JSON (docs/policy.schema.json)"},
    "application/yaml": {"type": "string", "description": "the policy as YAML"},
}
TEXT = {"text/plain": {"type": "string"}}
AUDIO = {"type": "string", "format": "binary"}
PATH_PARAMETERS = {"key_id": "the key's id (as returned by create)"}
# The dashboard's HTML pages, for browsers: not an API.
UNDOCUMENTED_PREFIX = "/admin/ui"

OPERATIONS: dict[str, Operation] = {
    "POST /v1/chat/completions": v1(
        "Chat completion", ChatCompletionRequest, streamed(ChatCompletion, OPENAI_EVENTS)
    ),
    "POST /v1/completions": v1(
        "Text completion", CompletionRequest, streamed(ChatCompletion, OPENAI_EVENTS)
    ),
    "POST /v1/embeddings": v1("Embeddings", EmbeddingRequest, json(EmbeddingList)),
    "POST /v1/images/generations": v1("Image generation", ImageRequest, json(ImageList)),
    "POST /v1/moderations": v1("Moderation", ModerationRequest, json(Moderation)),
    "POST /v1/audio/speech": v1(
        "Text to speech: the provider's audio bytes",
        SpeechRequest,
        {"audio/*": AUDIO, "application/octet-stream": AUDIO},
    ),
    "POST /v1/messages": v1(
        "Anthropic Messages (x-api-key or bearer); stream: true for Anthropic's events",
        "MessagesRequest",
        streamed(AnthropicMessage),
    ),
    "POST /v1/messages/count_tokens": v1(
        "Count a request's input tokens (Anthropic providers only; not charged)",
        "CountTokensRequest",
        json(TokenCount),
    ),
    "POST /v1/responses": v1(
        "OpenAI Responses API, stateless (store: false)",
        "ResponsesRequest",
        streamed(ResponseObject),
    ),
    "POST /v1/audio/transcriptions": upload("Transcription", json(Transcription) | TEXT),
    "POST /v1/audio/translations": upload("Translation", json(Transcription) | TEXT),
    "POST /v1/images/edits": upload("Image edit", json(ImageList)),
    "GET /v1/models": Operation(
        "Models and aliases this key may use",
        json(ModelList),
        parameters=(
            query(
                "available",
                {"type": "string", "enum": ["true", "false"]},
                "true: only the models that can be served now; false: only the others",
            ),
        ),
        errors=(400, 401, 503),
    ),
    "GET /v1/models/{model_id}": Operation(
        "One model or alias this key may use", json(Model), errors=(401, 404, 503)
    ),
    "GET /v1/usage": Operation(
        "The calling key's own usage over the last days",
        json(KeyUsage),
        query=OwnUsageQuery,
        errors=(400, 401, 503),
    ),
    "POST /admin/keys": Operation(
        "Create a key", json(IssuedKey), body=json(KeyCreate), status=201
    ),
    "GET /admin/keys": Operation("List keys", json(KeyList), query=KeyListQuery),
    "GET /admin/keys/{key_id}": Operation("Show a key", json(KeyView), errors=RECORD_ERRORS),
    "PATCH /admin/keys/{key_id}": Operation(
        "Change a key's fields (null clears one)",
        json(KeyView),
        body=json(KeyUpdate),
        errors=RECORD_ERRORS,
    ),
    "POST /admin/keys/{key_id}/rotate": Operation(
        "Issue a new secret; the old one stays valid for grace_seconds",
        json(IssuedKey),
        body=json(RotateRequest),
        parameters=(
            header(
                "Idempotency-Key",
                {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY_CHARS},
            ),
        ),
        errors=(*RECORD_ERRORS, 409),
    ),
    "POST /admin/keys/{key_id}/revoke": Operation(
        "Revoke a key", json(KeyView), errors=RECORD_ERRORS
    ),
    "POST /admin/teams": Operation(
        "Create a team (adopts the keys whose team names it)",
        json(CreatedTeam),
        body=json(TeamCreate),
        errors=(*ADMIN_ERRORS, 409),
        status=201,
    ),
    "GET /admin/teams": Operation("List teams", json(TeamList), query=TeamListQuery),
    "GET /admin/teams/{team_id}": Operation(
        "A team, and its usage of its limits now", json(TeamWithUsage), errors=RECORD_ERRORS
    ),
    "PATCH /admin/teams/{team_id}": Operation(
        "Change a team's limits (null clears one)",
        json(TeamView),
        body=json(TeamUpdate),
        errors=RECORD_ERRORS,
    ),
    "DELETE /admin/teams/{team_id}": Operation(
        "Delete a team that has no keys", json(TeamDeleted), errors=(*RECORD_ERRORS, 409)
    ),
    "POST /admin/tokens": Operation(
        "Create a named admin token (shown once)",
        json(IssuedAdminToken),
        body=json(TokenCreate),
        status=201,
    ),
    "GET /admin/tokens": Operation("List admin tokens", json(AdminTokenList), query=TokenListQuery),
    "GET /admin/tokens/{token_id}": Operation(
        "Show an admin token", json(AdminTokenView), errors=RECORD_ERRORS
    ),
    "POST /admin/tokens/{token_id}/revoke": Operation(
        "Revoke an admin token", json(AdminTokenView), errors=RECORD_ERRORS
    ),
    "GET /admin/audit": Operation(
        "The audit log, newest first", with_csv(AuditList), query=AuditListQuery
    ),
    "GET /admin/usage": Operation(
        "Usage grouped by one dimension over a date range",
        with_csv(UsageReport),
        query=AdminUsageQuery,
    ),
    "GET /admin/usage/events": Operation(
        "Raw usage events, newest first", json(UsageEvents), query=UsageEventsQuery
    ),
    "GET /admin/usage/dead-letters": Operation(
        "Usage events the store could not keep, oldest first (viewer)",
        json(DeadLetterList),
        query=DeadLetterListQuery,
    ),
    "POST /admin/usage/dead-letters/replay": Operation(
        "Store dead letters again, optionally with labels corrected (admin)",
        json(DeadLettersReplayed),
        body=json(ReplayRequest),
    ),
    "GET /admin/cache": Operation(
        "Response cache stats, per scope", json(CacheStatsView), query=CacheQuery
    ),
    "DELETE /admin/cache": Operation(
        "Purge cached answers of a model and/or team (or all=true)",
        json(CachePurged),
        query=PurgeQuery,
    ),
    "GET /admin/policy": Operation(
        "The policy in force (format=yaml, admin role: the YAML text in force)",
        # The file's text: a YAML mapping (what a YAML reader of the answer finds).
        json(PolicyState) | {"application/yaml": {"type": "object"}},
        parameters=(query("format", {"enum": ["json", "yaml"]}, "default json"),),
    ),
    "PUT /admin/policy": Operation(
        "Replace the policy (validated, written, applied)",
        json(PolicyApplied),
        body=POLICY_BODY,
    ),
    "POST /admin/policy/validate": Operation(
        "Validate a policy without applying it", json(PolicyValid), body=POLICY_BODY
    ),
    "POST /admin/route/explain": Operation(
        "The candidates a request would be routed to, with reasons",
        json(RouteExplanation),
        body=json(ExplainRequest),
    ),
    "GET /admin/health": Operation(
        "Readiness checks with details (policy error, engine error)", json(AdminHealth)
    ),
    "GET /healthz": Operation("Liveness", json(Health)),
    "GET /readyz": Operation(
        "Readiness (states only): Redis reachable, policy loaded, not draining",
        json(ReadinessView),
        also={503: ("not ready", json(ReadinessView))},
    ),
    "GET /metrics": Operation(
        "Prometheus metrics (bearer SWITCHYARD_METRICS_TOKEN when set)", TEXT, errors=(401,)
    ),
    "GET /openapi.json": Operation("This document", json({"type": "object"})),
}
