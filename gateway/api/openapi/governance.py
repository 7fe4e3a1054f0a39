"""OpenAPI paths and schemas of the governance endpoints: teams (``operator``), admin tokens
and the audit log (``admin``). Written from their validators (``access/team_models.py``,
``access/token_admin.py``, ``api/audit.py``); ``api/openapi.py`` merges them into the document."""

from __future__ import annotations

from typing import Any

from gateway.access.admins import ROLES
from gateway.access.teams import TEAM_ID_PATTERN
from gateway.api.openapi.operations import ADMIN_ERRORS, DAY, admin, csv_report, query, record_admin
from gateway.api.openapi.schemas import (
    ALERT_THRESHOLDS,
    BOOLEAN,
    BUDGET_MODE,
    INTEGER,
    LABEL,
    NUMBER,
    STRING,
    Schema,
    list_of,
    nullable,
    obj,
    ref,
    with_secret,
)
from gateway.ledger.audit import MAX_AUDIT_LIMIT
from gateway.money import MAX_BUDGET_USD

PERIODS = ("day", "week", "month", "total")
USD = {"type": "number", "minimum": 0, "maximum": MAX_BUDGET_USD}
TEAM_FIELDS: dict[str, Schema] = {
    "name": nullable(LABEL),
    "rpm": nullable({"type": "integer", "minimum": 0, "maximum": 10_000_000}),
    "tpm": nullable({"type": "integer", "minimum": 0, "maximum": 10_000_000_000}),
    "max_parallel_requests": nullable({"type": "integer", "minimum": 0, "maximum": 1_000_000}),
    "budgets_usd": nullable(
        obj(
            {period: USD for period in PERIODS},
            additionalProperties=False,
            description="USD per period, at most 9 decimal places each",
        )
    ),
    "budget_mode": BUDGET_MODE,
    "alert_thresholds": ALERT_THRESHOLDS,
}
TEAM_ID = {"type": "string", "minLength": 1, "maxLength": 64, "pattern": TEAM_ID_PATTERN}

SCHEMAS: dict[str, Schema] = {
    "TeamCreate": obj({"id": TEAM_ID, **TEAM_FIELDS}, ["id"], additionalProperties=False),
    "TeamUpdate": obj(TEAM_FIELDS, additionalProperties=False),
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
    "TeamWithUsage": {
        "allOf": [ref("Team"), obj({"usage": {"type": "object"}}, ["usage"])],
    },
    "TeamList": list_of("Team", has_more=BOOLEAN),
    "TeamDeleted": obj(
        {"id": STRING, "object": {"const": "team"}, "deleted": {"const": True}},
        ["id", "object", "deleted"],
    ),
    "TokenCreate": obj(
        {
            "name": LABEL,
            "role": {"enum": list(ROLES)},
        },
        ["name", "role"],
        additionalProperties=False,
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


def governance_paths() -> dict[str, Any]:
    """The teams, admin tokens and audit log paths."""
    team_id = {"name": "team_id", "in": "path", "required": True, "schema": STRING}
    token_id = {"name": "token_id", "in": "path", "required": True, "schema": STRING}
    limit = {"type": "integer", "minimum": 1, "maximum": 1000}
    return {
        "/admin/teams": {
            "post": admin(
                "Create a team (adopts the keys whose team names it)",
                "TeamCreated",
                status="201",
                body="TeamCreate",
                errors=(*ADMIN_ERRORS, 409),
            ),
            "get": admin(
                "List teams",
                "TeamList",
                params=[query("limit", limit), query("after", {"type": "string", "maxLength": 64})],
            ),
        },
        "/admin/teams/{team_id}": {
            "get": record_admin(
                "A team, and its usage of its limits now", "TeamWithUsage", team_id
            ),
            "patch": record_admin(
                "Change a team's limits (null clears one)", "Team", team_id, body="TeamUpdate"
            ),
            "delete": record_admin("Delete a team that has no keys", "TeamDeleted", team_id, 409),
        },
        "/admin/tokens": {
            "post": admin(
                "Create a named admin token (shown once)",
                "AdminTokenWithSecret",
                status="201",
                body="TokenCreate",
            ),
            "get": admin(
                "List admin tokens",
                "AdminTokenList",
                params=[
                    query("limit", limit),
                    query("after", {"type": "string", "maxLength": 200}),
                ],
            ),
        },
        "/admin/tokens/{token_id}": {
            "get": record_admin("Show an admin token", "AdminToken", token_id)
        },
        "/admin/tokens/{token_id}/revoke": {
            "post": record_admin("Revoke an admin token", "AdminToken", token_id)
        },
        "/admin/audit": {
            "get": csv_report(
                "The audit log, newest first",
                "AuditList",
                [
                    query("actor", {"type": "string", "maxLength": 200}, "token id or name"),
                    query("action", {"type": "string", "maxLength": 100}, "e.g. key.rotate"),
                    query("target", {"type": "string", "maxLength": 300}, "e.g. key:<id>"),
                    query("from", DAY, "YYYY-MM-DD, UTC"),
                    query("to", DAY, "YYYY-MM-DD, UTC, inclusive"),
                    query("cursor", {"type": "string", "maxLength": 500}),
                    query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_AUDIT_LIMIT}),
                ],
            )
        },
    }
