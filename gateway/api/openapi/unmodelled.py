"""JSON Schemas of the shapes no model defines, written out for the OpenAPI document.

Two kinds: the answers handlers build as dicts (a record's ``public_view``, a report, a
provider's answer passed through), and the bodies of the doors whose format parsers check
them field by field in code (``formats/anthropic_messages`` and ``formats/openai_responses``
``request_parse.py``, the multipart uploads). Everything the models define is generated
instead (``models.py``), and a model class may stand for its schema here (an answer
that holds one). ``tests/api`` fuzzes the running server against both, so a
drift on either side fails a test.
"""

from __future__ import annotations

from typing import Any

from gateway.api.openapi.models import Schema, ref
from gateway.ledger.dead_letters import LETTER_ID_PATTERN

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


USAGE = obj(
    {"prompt_tokens": INTEGER, "completion_tokens": INTEGER, "total_tokens": INTEGER},
    ["prompt_tokens", "total_tokens"],
)

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

# Answers of the /v1 doors: the provider's, relayed (or translated to the door's format).
V1_ANSWERS: dict[str, Schema] = {
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
    "AnthropicError": obj(
        {
            "type": {"const": "error"},
            "error": obj({"type": STRING, "message": STRING}, ["type", "message"]),
        },
        ["type", "error"],
    ),
    "ChatCompletion": obj(
        {
            "id": STRING,
            "object": STRING,
            "created": INTEGER,
            "model": STRING,
            "choices": OBJECTS,
            "usage": USAGE,
        },
        ["id", "object", "choices"],
    ),
    "EmbeddingList": obj(
        {"object": STRING, "data": {"type": "array"}, "model": STRING, "usage": USAGE},
        ["data"],
    ),
    "ImageList": obj({"created": INTEGER, "data": {"type": "array"}}, ["data"]),
    "AnthropicMessage": obj(
        {
            "id": STRING,
            "type": {"const": "message"},
            "role": {"const": "assistant"},
            "model": STRING,
            "content": OBJECTS,
            "stop_reason": nullable(STRING),
            "usage": {"type": "object"},
        },
        ["id", "type", "role", "content", "usage"],
    ),
    "TokenCount": obj({"input_tokens": INTEGER}, ["input_tokens"]),
    "Response": obj(
        {
            "id": STRING,
            "object": {"const": "response"},
            "status": STRING,
            "model": STRING,
            "output": OBJECTS,
            "usage": nullable({"type": "object"}),
        },
        ["id", "object", "status", "output"],
    ),
    "Moderation": obj({"id": STRING, "model": STRING, "results": OBJECTS}, ["results"]),
    "OperationResult": {"type": "object", "description": "the provider's answer, as it sent it"},
    # api/v1/openai.py _entry: one model or alias, in the list and alone.
    "Model": obj(
        {
            "id": STRING,
            "object": {"const": "model"},
            "created": INTEGER,
            "owned_by": STRING,
            "description": STRING,
            "context_window": INTEGER,
            "available": {"type": "boolean", "description": "its provider can serve it now"},
            "unavailable_reason": {**STRING, "description": "why not (a key not set...)"},
            "answered_by": {**STRING, "description": "the fallback that would answer instead"},
        },
        ["id", "object", "created", "owned_by", "available"],
    ),
    "ModelList": list_of("Model"),
}

UNMODELLED: dict[str, Schema] = PARSED_BODIES | V1_ANSWERS
