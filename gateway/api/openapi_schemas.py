"""JSON Schemas (OpenAPI 3.1 dialect) of what the gateway accepts and returns.

Written from the validators that enforce them (``api/request_models.py`` for /v1, the pydantic
models of ``access/key_models.py``, the report and policy handlers); ``tests/api`` fuzzes the running
server against them with schemathesis, so a drift on either side fails a test.
"""

from __future__ import annotations

from typing import Any

from gateway.access.key_models import MAX_GRACE_S
from gateway.api.request_models import ROLES
from gateway.cache.stats import COUNTERS as CACHE_COUNTERS
from gateway.ledger.event import MAX_TAG_LENGTH, MAX_TAGS
from gateway.ledger.record import MAX_LABEL_LENGTH
from gateway.metering.reports import GROUP_BYS, MAX_EVENTS_LIMIT
from gateway.money import MAX_BUDGET_USD
from gateway.policy.operations import OPERATIONS

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def obj(properties: dict[str, Schema], required: list[str] | None = None, **extra: Any) -> Schema:
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    schema.update(extra)
    return schema


def list_of(item: str, **paging: Schema) -> Schema:
    """A list answer: ``object: "list"``, ``data`` of ``item`` and the paging fields, all
    required."""
    return obj(
        {"object": {"const": "list"}, "data": {"type": "array", "items": ref(item)}, **paging},
        ["object", "data", *paging],
    )


def with_secret(record: str, secret: str) -> Schema:
    """``record`` with its ``secret`` field, which only the answer that issues it carries."""
    return {
        "allOf": [
            ref(record),
            obj({secret: {"type": "string", "description": "shown once"}}, [secret]),
        ]
    }


STRING = {"type": "string"}
INTEGER = {"type": "integer"}
NUMBER = {"type": "number"}
BOOLEAN = {"type": "boolean"}
# A name that may reach the usage ledger (gateway/ledger/record.py label_problem): no control
# characters; the pattern names the ASCII and Latin-1 ones, the server refuses every
# non-printable character.
LABEL = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_LABEL_LENGTH,
    "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]*$",
    "description": "printable characters only (no tab, newline or other control character)",
}


def integers(*names: str) -> dict[str, Schema]:
    """Properties that are all integers (counts of requests and tokens)."""
    return dict.fromkeys(names, INTEGER)


MODEL_NAME = {"type": "string", "minLength": 1, "description": "a model or alias of the policy"}


BUDGET_MODE = nullable(
    {"enum": ["hard", "soft"], "description": "hard refuses past the budget; soft only alerts"}
)
ALERT_THRESHOLDS = nullable(
    {
        "type": "array",
        "items": {"type": "integer", "minimum": 1, "maximum": 100},
        "maxItems": 10,
        "uniqueItems": True,
        "description": "percents of the budget; each crossing is a signed webhook",
    }
)


def _int_range(low: int, high: int) -> Schema:
    return nullable({"type": "integer", "minimum": low, "maximum": high})


def _number_range(low: float, high: float) -> Schema:
    return nullable({"type": "number", "minimum": low, "maximum": high})


# Unknown fields pass through to the provider, so /v1 bodies allow additional properties.
# These mirror api/request_models.py field by field.
NON_EMPTY = {"type": "string", "minLength": 1}
SAMPLING: dict[str, Schema] = {
    "max_tokens": _int_range(1, 10_000_000),
    "max_completion_tokens": _int_range(1, 10_000_000),
    "n": _int_range(1, 128),
    "best_of": _int_range(1, 128),
    "temperature": _number_range(0, 2),
    "top_p": _number_range(0, 1),
    "presence_penalty": _number_range(-2, 2),
    "frequency_penalty": _number_range(-2, 2),
    "stop": nullable({"anyOf": [STRING, {"type": "array", "items": STRING}]}),
    "user": nullable(STRING),
    "metadata": nullable(
        obj(
            {"task_type": nullable(STRING)},
            description="task_type picks the routing task; other entries pass through",
        )
    ),
}
STREAMING: dict[str, Schema] = {
    "stream": nullable(BOOLEAN),
    "stream_options": nullable(
        obj({"include_usage": nullable(BOOLEAN)}, description="only with stream: true")
    ),
}
NOT_STREAMED = {"enum": [False, None]}
CONTENT = {
    "anyOf": [
        STRING,
        {"type": "array", "items": obj({"type": STRING, "text": nullable(STRING)}, ["type"])},
    ]
}
FUNCTION_CALL = obj({"name": nullable(STRING), "arguments": nullable(STRING)})
MESSAGE = {
    "oneOf": [
        obj(
            {"role": {"enum": ["system", "developer", "user"]}, "content": CONTENT}
            | {"name": nullable(STRING)},
            ["role", "content"],
        ),
        obj(
            {
                "role": {"const": "assistant"},
                "content": nullable(CONTENT),
                "name": nullable(STRING),
                "tool_calls": nullable(
                    {
                        "type": "array",
                        "items": obj(
                            {"type": nullable(STRING), "function": nullable(FUNCTION_CALL)}
                        ),
                    }
                ),
                "function_call": nullable(FUNCTION_CALL),
            },
            ["role"],
        ),
        obj(
            {
                "role": {
                    "enum": [
                        r for r in ROLES if r not in ("system", "developer", "user", "assistant")
                    ]
                },
                "content": nullable(CONTENT),
                "name": nullable(STRING),
            },
            ["role"],
        ),
    ]
}
FUNCTION_DEFINITION = obj(
    {
        "name": NON_EMPTY,
        "description": nullable(STRING),
        "parameters": nullable({"type": "object"}),
        "strict": nullable(BOOLEAN),
    },
    ["name"],
)
TOOLS: dict[str, Schema] = {
    "tools": nullable(
        {
            "type": "array",
            "items": obj({"type": NON_EMPTY, "function": nullable(FUNCTION_DEFINITION)}, ["type"]),
        }
    ),
    "functions": nullable({"type": "array", "items": FUNCTION_DEFINITION}),
    "response_format": nullable(
        obj(
            {
                "type": NON_EMPTY,
                "json_schema": nullable(
                    obj(
                        {
                            "name": NON_EMPTY,
                            "schema": nullable({"type": "object"}),
                            "description": nullable(STRING),
                            "strict": nullable(BOOLEAN),
                        },
                        ["name"],
                    )
                ),
            },
            ["type"],
        )
    ),
}
# A prompt or embedding input: text, or a non-empty array of texts, token ids or token arrays.
BATCH = {
    "type": "array",
    "minItems": 1,
    "items": {"anyOf": [STRING, INTEGER, {"type": "array", "items": INTEGER}]},
}
USAGE = obj(
    {"prompt_tokens": INTEGER, "completion_tokens": INTEGER, "total_tokens": INTEGER},
    ["prompt_tokens", "total_tokens"],
)
USAGE_ROW = obj(
    {
        **integers(
            "requests", "prompt_tokens", "completion_tokens", "cached_tokens", "total_tokens"
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
KEY_FIELDS: dict[str, Schema] = {
    "name": nullable(LABEL),
    "team": nullable(LABEL),
    "models": nullable({"type": "array", "maxItems": 1000, "items": LABEL}),
    "rpm": _int_range(0, 10_000_000),
    "tpm": _int_range(0, 10_000_000_000),
    "budget_usd": nullable(
        {
            "type": "number",
            "minimum": 0,
            "maximum": MAX_BUDGET_USD,
            "description": "USD with at most 9 decimal places (kept as integer nano-dollars)",
        }
    ),
    "budget_period": nullable({"enum": ["day", "week", "month", "total"]}),
    "max_parallel_requests": _int_range(0, 1_000_000),
    "budget_mode": BUDGET_MODE,
    "alert_thresholds": ALERT_THRESHOLDS,
    "tags": nullable(
        {
            "type": "array",
            "maxItems": MAX_TAGS,
            "items": {"type": "string", "minLength": 1, "maxLength": MAX_TAG_LENGTH},
            "description": "tags of the key's requests that name none of their own "
            "(letters, digits and - _ . : / = @)",
        }
    ),
    "expires_at": nullable(
        {
            "anyOf": [{"type": "number", "exclusiveMinimum": 0}, STRING],
            "description": "unix timestamp (a number, or a string of one) or ISO 8601 "
            "date-time (UTC if no zone), in the future",
        }
    ),
    "metadata": nullable(
        {
            "type": "object",
            "propertyNames": {"maxLength": 100},
            "additionalProperties": {"type": ["string", "number", "boolean", "null"]},
            "description": "at most 4096 bytes as JSON",
        }
    ),
}


SCHEMAS: dict[str, Schema] = {
    "Error": obj(
        {
            "error": obj(
                {
                    "message": STRING,
                    "type": STRING,
                    "param": nullable(STRING),
                    "code": nullable(STRING),
                },
                ["message", "type", "param", "code"],
            )
        },
        ["error"],
    ),
    "ChatCompletionRequest": obj(
        {
            "model": nullable(MODEL_NAME),
            "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
        }
        | STREAMING
        | SAMPLING
        | TOOLS,
        ["messages"],
        description="model is optional: without it the policy routes by task",
    ),
    "CompletionRequest": obj(
        {"model": nullable(MODEL_NAME), "prompt": {"anyOf": [STRING, BATCH]}}
        | STREAMING
        | SAMPLING,
        ["prompt"],
    ),
    "EmbeddingRequest": obj(
        {
            "model": MODEL_NAME,
            "input": {"anyOf": [NON_EMPTY, BATCH]},
            "stream": NOT_STREAMED,
            "user": nullable(STRING),
            "metadata": SAMPLING["metadata"],
        },
        ["model", "input"],
    ),
    "ImageRequest": obj(
        {
            "model": MODEL_NAME,
            "prompt": NON_EMPTY,
            "n": _int_range(1, 10),
            "stream": NOT_STREAMED,
            "user": nullable(STRING),
            "metadata": SAMPLING["metadata"],
        },
        ["model", "prompt"],
    ),
    "ChatCompletion": obj(
        {
            "id": STRING,
            "object": STRING,
            "created": INTEGER,
            "model": STRING,
            "choices": {"type": "array", "items": {"type": "object"}},
            "usage": USAGE,
        },
        ["id", "object", "choices"],
    ),
    "EmbeddingList": obj(
        {"object": STRING, "data": {"type": "array"}, "model": STRING, "usage": USAGE},
        ["data"],
    ),
    "ImageList": obj({"created": INTEGER, "data": {"type": "array"}}, ["data"]),
    "ModelList": obj(
        {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": obj(
                    {
                        "id": STRING,
                        "object": {"const": "model"},
                        "created": INTEGER,
                        "owned_by": STRING,
                    },
                    ["id", "object", "created", "owned_by"],
                ),
            },
        },
        ["object", "data"],
    ),
    "KeyUsage": obj(
        {
            "object": {"const": "usage"},
            "key_id": STRING,
            "days": INTEGER,
            "from": {"type": "string", "format": "date"},
            "to": {"type": "string", "format": "date"},
            "total_cost": NUMBER,
            **integers(
                "total_cost_nanos",
                "total_tokens",
                "prompt_tokens",
                "completion_tokens",
                "requests",
                "errors",
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
    "UsageRow": USAGE_ROW,
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
    "KeyCreate": obj(KEY_FIELDS, additionalProperties=False),
    "KeyUpdate": obj(KEY_FIELDS, additionalProperties=False),
    "RotateRequest": obj(
        {"grace_seconds": {"type": "number", "minimum": 0, "maximum": MAX_GRACE_S}},
        additionalProperties=False,
    ),
    "Key": obj(
        {
            "id": STRING,
            "object": {"const": "api_key"},
            "name": nullable(STRING),
            "team": nullable(STRING),
            "models": nullable({"type": "array", "items": STRING}),
            "rpm": nullable(INTEGER),
            "tpm": nullable(INTEGER),
            "budget_usd": nullable(NUMBER),
            "budget_period": nullable(STRING),
            "max_parallel_requests": nullable(INTEGER),
            "budget_mode": {"enum": ["hard", "soft"]},
            "alert_thresholds": {"type": "array", "items": INTEGER},
            "tags": {"type": "array", "items": STRING},
            "expires_at": nullable(NUMBER),
            "metadata": {"type": "object"},
            "status": {"enum": ["active", "revoked", "expired"]},
            "created_at": NUMBER,
            "updated_at": nullable(NUMBER),
            "rotated_at": nullable(NUMBER),
            "revoked_at": nullable(NUMBER),
            "previous_secret_valid_until": nullable(NUMBER),
        },
        ["id", "object", "status", "created_at"],
    ),
    "KeyWithSecret": with_secret("Key", "key"),
    "KeyList": list_of(
        "Key", has_more=BOOLEAN, first_id=nullable(STRING), last_id=nullable(STRING)
    ),
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
    "ExplainRequest": obj(
        {
            "body": {
                "type": "object",
                "description": "the /v1 request body to route; the fields routing reads are "
                "checked as a /v1 request checks them",
            },
            "headers": {"type": "object", "additionalProperties": STRING},
            "key_id": {"type": "string", "maxLength": 200},
            "allowed_models": nullable({"type": "array", "items": STRING}),
            "operation": {
                "enum": sorted(OPERATIONS),
                "description": "the operation of the door the body would be sent to (default "
                "chat): a pinned model that does not serve it is a 404 model_not_supported",
            },
        },
        additionalProperties=False,
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
    "Health": obj({"status": {"const": "ok"}}, ["status"]),
    "Readiness": obj(
        {
            "status": {"enum": ["ready", "not ready"]},
            "checks": {"type": "object", "additionalProperties": STRING},
        },
        ["status", "checks"],
    ),
    "CacheStats": obj(
        {
            "entries": INTEGER,
            "hit_ratio": nullable({"type": "number"}),
            **{name: INTEGER for name in CACHE_COUNTERS},
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
    "CachePurged": obj(
        {"purged": obj({"scopes": INTEGER, "entries": INTEGER}, ["scopes", "entries"])},
        ["purged"],
    ),
    "AdminHealth": obj(
        {
            "status": {"enum": ["ready", "not ready"]},
            "checks": {"type": "object", "additionalProperties": STRING},
            "details": {"type": "object"},
        },
        ["status", "checks", "details"],
    ),
}

QUERY_LIMITS = {"max_events": MAX_EVENTS_LIMIT, "max_usage_days": 400}
