"""OpenAPI paths and schemas of the usage store's dead letters (``api/dead_letters.py``):
written from its validators; ``api/openapi.py`` merges them into the document."""

from __future__ import annotations

from typing import Any

from gateway.api.openapi.operations import admin, query
from gateway.api.openapi.schemas import (
    INTEGER,
    LABEL,
    STRING,
    Schema,
    list_of,
    nullable,
    obj,
)
from gateway.ledger.dead_letters import LETTER_ID_PATTERN, MAX_DEAD_LETTER_LIMIT
from gateway.metering.dead_letters import CORRECTABLE

LETTER_ID = {"type": "string", "pattern": LETTER_ID_PATTERN}
# A correction may clear a label ("" is no team, no end user), else it is a ledger label.
CORRECTION = nullable({**LABEL, "minLength": 0})
TAGS = nullable({"type": "array", "items": STRING})

SCHEMAS: dict[str, Schema] = {
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
    "DeadLetterReplay": obj(
        {
            "ids": nullable(
                {"type": "array", "items": LETTER_ID, "maxItems": MAX_DEAD_LETTER_LIMIT}
            ),
            "set": nullable(
                obj(
                    {name: TAGS if name == "tags" else CORRECTION for name in CORRECTABLE},
                    additionalProperties=False,
                    description="labels set on every replayed event",
                )
            ),
        },
        additionalProperties=False,
    ),
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


def dead_letter_paths() -> dict[str, Any]:
    return {
        "/admin/usage/dead-letters": {
            "get": admin(
                "Usage events the store could not keep, oldest first (viewer)",
                "DeadLetterList",
                params=[
                    query(
                        "limit",
                        {"type": "integer", "minimum": 1, "maximum": MAX_DEAD_LETTER_LIMIT},
                    ),
                    query("cursor", {"type": "string", "maxLength": 500}),
                ],
            )
        },
        "/admin/usage/dead-letters/replay": {
            "post": admin(
                "Store dead letters again, optionally with labels corrected (admin)",
                "DeadLetterReplayed",
                body="DeadLetterReplay",
            )
        },
    }
