"""JSON Schemas of the shapes no model defines, written out for the OpenAPI document: the
bodies of the doors whose format parsers check them field by field in code
(``formats/anthropic_messages`` and ``formats/openai_responses`` ``request_parse.py``) and the
multipart uploads. Every answer is generated instead, from the ``TypedDict`` its builder
returns, as is every body a model checks (``models.py``). Why these stay written: a parser
reports the first problem in its own order and words (``max_tokens must be an integer from 0
to 1000000000``), which a model's conversion would change, and it builds the internal
request as it checks, so a model would be a second pass, not a replacement. ``tests/api``
fuzzes the running server against them, so a drift on either side fails a test.
"""

from __future__ import annotations

from typing import Any

from gateway.api.openapi.models import Schema

STRING = {"type": "string"}
BOOLEAN = {"type": "boolean"}
OBJECTS = {"type": "array", "items": {"type": "object"}}
MODEL_NAME = {"type": "string", "minLength": 1, "description": "a model or alias of the policy"}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def obj(properties: dict[str, Schema], required: list[str] | None = None, **extra: Any) -> Schema:
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema | extra


def _range(kind: str, low: float, high: float) -> Schema:
    return nullable({"type": kind, "minimum": low, "maximum": high})


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

UNMODELLED: dict[str, Schema] = PARSED_BODIES
