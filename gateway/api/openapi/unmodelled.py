"""JSON Schemas of the shapes no model defines, written out for the OpenAPI document.

Two kinds: the admin answers handlers build as dicts with no ``TypedDict`` declared for
them (a record's ``public_view``, a report), and the bodies of the doors whose format parsers
check them field by field in code (``formats/anthropic_messages`` and
``formats/openai_responses`` ``request_parse.py``, the multipart uploads). Everything the
models define is generated instead (``models.py``), as is every answer whose builder returns
a ``TypedDict`` (the /v1 answers and error envelopes, the batches, the API keys), and a model
class may stand for its schema here (an answer that holds one). ``tests/api`` fuzzes the
running server against both, so a drift on either side fails a test.
"""

from __future__ import annotations

from typing import Any

from gateway.access.admins import ROLES
from gateway.api.openapi.models import Schema, ref
from gateway.cache.stats import COUNTERS as CACHE_COUNTERS
from gateway.cache.stats import PurgeResult
from gateway.ledger.dead_letters import LETTER_ID_PATTERN
from gateway.metering.reports import GROUP_BYS

STRING = {"type": "string"}
INTEGER = {"type": "integer"}
NUMBER = {"type": "number"}
BOOLEAN = {"type": "boolean"}
OBJECTS = {"type": "array", "items": {"type": "object"}}
MODEL_NAME = {"type": "string", "minLength": 1, "description": "a model or alias of the policy"}
LETTER_ID = {"type": "string", "pattern": LETTER_ID_PATTERN}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def obj(properties: dict[str, Schema], required: list[str] | None = None, **extra: Any) -> Schema:
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema | extra


def list_of(item: str, **paging: Schema) -> Schema:
    """A list answer: ``object: "list"``, ``data`` of ``item`` and the paging fields, all
    required."""
    return obj(
        {"object": {"const": "list"}, "data": {"type": "array", "items": ref(item)}, **paging},
        ["object", "data", *paging],
    )


def with_secret(record: str, secret: str) -> Schema:
    """``record`` with its ``secret`` field, which only the answer that issues it carries."""
    secret_field = obj({secret: {"type": "string", "description": "shown once"}}, [secret])
    return {"allOf": [ref(record), secret_field]}


def _range(kind: str, low: float, high: float) -> Schema:
    return nullable({"type": kind, "minimum": low, "maximum": high})


# How fresh a usage report is (docs/usage.md#freshness).
FRESHNESS: dict[str, Schema] = {
    "as_of": {"type": "string", "format": "date-time", "description": "when it was read (UTC)"},
    "pending_export": nullable(
        {"type": "integer", "description": "events not in the usage store yet; null: unknown"}
    ),
    "export_lag_s": nullable({"type": "number", "description": "age of the oldest of them"}),
}
ROUTE_ROW = obj(
    {"model": STRING, "provider": STRING, "upstream_model": STRING, "reason": STRING},
    ["model", "provider", "reason"],
)
READINESS = {
    "status": {"enum": ["ready", "not ready"]},
    "checks": {"type": "object", "additionalProperties": STRING},
}

# Bodies the format parsers check in code: only what they check; unknown fields pass through.
PARSED_BODIES: dict[str, Schema] = {
    "MessagesRequest": obj(
        {
            "model": MODEL_NAME,
            "max_tokens": {"type": "integer", "minimum": 0, "maximum": 1_000_000_000},
            "messages": {
                "type": "array",
                "items": obj(
                    {
                        "role": {"enum": ["user", "assistant", "system"]},
                        "content": {"anyOf": [STRING, OBJECTS]},
                    },
                    ["role", "content"],
                ),
            },
            "system": nullable({"anyOf": [STRING, OBJECTS]}),
            "stream": nullable(BOOLEAN),
            "temperature": _range("number", 0, 1),
            "top_p": _range("number", 0, 1),
            "top_k": _range("integer", 0, 1_000_000_000),
            "stop_sequences": nullable({"type": "array", "items": STRING}),
            "metadata": nullable(obj({"user_id": nullable(STRING)})),
        },
        ["model", "max_tokens", "messages"],
        description="Anthropic's Messages request; unknown fields pass through",
    ),
    "CountTokensRequest": obj(
        {"model": MODEL_NAME, "messages": OBJECTS},
        ["model", "messages"],
    ),
    "ResponsesRequest": obj(
        {
            "model": MODEL_NAME,
            "input": {"anyOf": [STRING, OBJECTS]},
            "instructions": nullable(STRING),
            "stream": nullable(BOOLEAN),
            "store": {"enum": [False, None], "description": "stateless: never true"},
            "max_output_tokens": _range("integer", 1, 1_000_000_000),
            "temperature": _range("number", 0, 2),
            "top_p": _range("number", 0, 1),
            "tools": nullable(OBJECTS),
            "user": nullable(STRING),
        },
        ["model", "input"],
        description="stateless: previous_response_id, conversation and background: true "
        "are refused with a 400",
    ),
    "Upload": obj(
        {
            "model": {**MODEL_NAME, "description": "sent before the file"},
            "file": {"type": "string", "format": "binary"},
            "prompt": STRING,
        },
        ["model", "file"],
    ),
}

# Usage reports (metering/reports.py builds them).
USAGE_ROW = obj(
    {
        **dict.fromkeys(
            ("requests", "prompt_tokens", "completion_tokens", "cached_tokens", "total_tokens"),
            INTEGER,
        ),
        "cost": {"type": "number", "description": "USD, a rendering of cost_nanos"},
        "cost_nanos": {"type": "integer", "description": "nano-dollars (1e-9 USD), exact"},
        "errors": INTEGER,
        "error_rate": NUMBER,
        "avg_latency_ms": NUMBER,
        "streamed": INTEGER,
        "estimated": INTEGER,
        # group_by=key: the key's name and team now (null when it has none, or is gone)
        "key_name": nullable(STRING),
        "key_team": nullable(STRING),
    },
    ["requests", "total_tokens", "cost", "cost_nanos", "errors"],
)
REPORTS: dict[str, Schema] = {
    "UsageRow": USAGE_ROW,
    "KeyUsage": obj(
        {
            "object": {"const": "usage"},
            "key_id": STRING,
            "days": INTEGER,
            "from": {"type": "string", "format": "date"},
            "to": {"type": "string", "format": "date"},
            "total_cost": NUMBER,
            **dict.fromkeys(
                (
                    "total_cost_nanos",
                    "total_tokens",
                    "prompt_tokens",
                    "completion_tokens",
                    "requests",
                    "errors",
                ),
                INTEGER,
            ),
            "by_model": {"type": "array", "items": ref("UsageRow")},
            "by_day": {"type": "array", "items": ref("UsageRow")},
            # with group_by=tag or group_by=user
            "by_tag": {"type": "array", "items": ref("UsageRow")},
            "by_user": {"type": "array", "items": ref("UsageRow")},
            **FRESHNESS,
        },
        ["object", "key_id", "days", "from", "to", "requests", "by_model", "by_day"],
    ),
    "UsageReport": obj(
        {
            "object": {"const": "usage_report"},
            "group_by": {"enum": list(GROUP_BYS)},
            "from": STRING,
            "to": STRING,
            "data": {"type": "array", "items": ref("UsageRow")},
            "totals": ref("UsageRow"),
            **FRESHNESS,
        },
        ["object", "group_by", "from", "to", "data", "totals"],
    ),
    "UsageEvents": obj(
        {
            "object": {"const": "list"},
            "data": {"type": "array", "items": obj({"id": STRING}, ["id"])},
            "has_more": BOOLEAN,
            "next_cursor": nullable(STRING),
            **FRESHNESS,
        },
        ["object", "data", "has_more", "next_cursor"],
    ),
    "DeadLetter": obj(
        {
            "object": {"const": "usage_dead_letter"},
            "id": LETTER_ID,
            "failed_at_ms": INTEGER,
            "event_id": STRING,
            "key_id": STRING,
            "field": STRING,
            "reason": STRING,
            "event": {"description": "the payload as JSON, null when it is not JSON"},
            "payload": STRING,
        },
        ["object", "id", "failed_at_ms", "event_id", "key_id", "field", "reason", "payload"],
    ),
    "DeadLetterList": list_of("DeadLetter", next_cursor=nullable(STRING), total=INTEGER),
    "DeadLetterReplayed": obj(
        {
            "object": {"const": "usage_dead_letter_replay"},
            "replayed": {"type": "array", "items": LETTER_ID},
            "inserted": INTEGER,
            "refused": {
                "type": "array",
                "items": obj({"id": LETTER_ID, "reason": STRING}, ["id", "reason"]),
            },
            "remaining": INTEGER,
        },
        ["object", "replayed", "inserted", "refused", "remaining"],
    ),
}

# Records as the admin API shows them (their ``public_view``).
RECORDS: dict[str, Schema] = {
    "Team": obj(
        {
            "id": STRING,
            "object": {"const": "team"},
            "name": nullable(STRING),
            "rpm": nullable(INTEGER),
            "tpm": nullable(INTEGER),
            "max_parallel_requests": nullable(INTEGER),
            "budgets_usd": {"type": "object", "additionalProperties": NUMBER},
            "budgets_nanos": {"type": "object", "additionalProperties": INTEGER},
            "budget_mode": {"enum": ["hard", "soft"]},
            "alert_thresholds": {"type": "array", "items": INTEGER},
            "created_at": NUMBER,
            "updated_at": NUMBER,
        },
        ["id", "object", "budgets_usd", "budgets_nanos", "created_at"],
    ),
    "TeamCreated": {
        "allOf": [
            ref("Team"),
            obj({"adopted_keys": {"type": "array", "items": STRING}}, ["adopted_keys"]),
        ]
    },
    "TeamWithUsage": {"allOf": [ref("Team"), obj({"usage": {"type": "object"}}, ["usage"])]},
    "TeamList": list_of("Team", has_more=BOOLEAN),
    "TeamDeleted": obj(
        {"id": STRING, "object": {"const": "team"}, "deleted": {"const": True}},
        ["id", "object", "deleted"],
    ),
    "AdminToken": obj(
        {
            "id": STRING,
            "object": {"const": "admin_token"},
            "name": STRING,
            "role": {"enum": list(ROLES)},
            "status": {"enum": ["active", "revoked"]},
            "created_at": NUMBER,
            "created_by": STRING,
            "revoked_at": nullable(NUMBER),
        },
        ["id", "object", "name", "role", "status", "created_at"],
    ),
    "AdminTokenWithSecret": with_secret("AdminToken", "token"),
    "AdminTokenList": list_of("AdminToken", has_more=BOOLEAN),
    "AuditEntry": obj(
        {
            "object": {"const": "audit_entry"},
            "event_id": STRING,
            "time_ms": INTEGER,
            "actor_kind": {"enum": ["bootstrap", "token", "cli"]},
            "actor_id": STRING,
            "actor_name": STRING,
            "actor_role": {"enum": list(ROLES)},
            "action": STRING,
            "target": STRING,
            "client": STRING,
            "request_id": STRING,
            "before": {},
            "after": {},
        },
        ["object", "event_id", "time_ms", "actor_kind", "actor_id", "action", "target"],
    ),
    "AuditList": list_of("AuditEntry", next_cursor=nullable(STRING)),
}

# The policy, the response cache and the probes.
OPERATIONS_ANSWERS: dict[str, Schema] = {
    "PolicyState": obj(
        {
            "version": nullable(STRING),
            "loaded_at": nullable(NUMBER),
            "source": nullable(STRING),
            "path": STRING,
            "last_error": nullable(obj({"path": nullable(STRING), "message": STRING})),
            "policy": nullable({"type": "object"}),
        },
        ["version", "path", "policy"],
    ),
    "PolicyApplied": obj(
        {"applied": {"const": True}, "version": STRING, "loaded_at": NUMBER},
        ["applied", "version"],
    ),
    "PolicyValid": obj(
        {
            "valid": {"const": True},
            "models": INTEGER,
            "tasks": {"type": "array", "items": STRING},
            "current_version": nullable(STRING),
        },
        ["valid", "models", "tasks"],
    ),
    "RouteExplanation": obj(
        {
            "task": nullable(STRING),
            "strategy": nullable(STRING),
            "policy_version": nullable(STRING),
            "candidates": {"type": "array", "items": ROUTE_ROW},
            "skipped": {"type": "array", "items": ROUTE_ROW},
            "notes": {"type": "array", "items": STRING},
            "health": {},
            "header": STRING,
            "fleets": {
                "type": "object",
                "description": "engine fleets among the candidates: provider -> the replica it "
                "would pick now (pick, header) and its replicas",
                "additionalProperties": {"type": "object"},
            },
        },
        ["candidates", "skipped"],
    ),
    "CacheStats": obj(
        {
            "entries": INTEGER,
            "hit_ratio": nullable(NUMBER),
            **dict.fromkeys(CACHE_COUNTERS, INTEGER),
            "scopes": {
                "type": "array",
                "items": obj(
                    {"namespace": STRING, "model": STRING, "entries": INTEGER},
                    ["namespace", "model", "entries", "hit_ratio", *CACHE_COUNTERS],
                ),
            },
        },
        ["entries", "hit_ratio", *CACHE_COUNTERS, "scopes"],
    ),
    "CachePurged": obj({"purged": PurgeResult}, ["purged"]),
    "Health": obj({"status": {"const": "ok"}}, ["status"]),
    "Readiness": obj(READINESS, ["status", "checks"]),
    "AdminHealth": obj(
        READINESS | {"details": {"type": "object"}}, ["status", "checks", "details"]
    ),
}

UNMODELLED: dict[str, Schema] = PARSED_BODIES | REPORTS | RECORDS | OPERATIONS_ANSWERS
