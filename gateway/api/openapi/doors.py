"""The OpenAPI description of the front doors beside Chat Completions: Anthropic Messages,
the Responses API, and the passed-through operations (moderations, speech, uploads, one model).

Request schemas declare only what the door checks (``formats/*/request_parse.py``,
``api/request_models.py``): unknown fields pass through. ``/v1/messages`` answers errors in
Anthropic's envelope (``AnthropicError``); the others in OpenAI's (``Error``).
"""

from __future__ import annotations

from typing import Any

from gateway.api.openapi.schemas import (
    BOOLEAN,
    INTEGER,
    MODEL_NAME,
    NON_EMPTY,
    NOT_STREAMED,
    SAMPLING,
    STRING,
    Schema,
    nullable,
    obj,
    ref,
)

JSON = "application/json"
SSE = "text/event-stream"
ERROR_REASONS = {
    400: "invalid request (the message names the field)",
    401: "missing or unknown credentials",
    403: "the key may not do this",
    404: "no such model, or one that does not serve this operation (model_not_supported)",
    413: "body too large",
    429: "rate limit or budget exceeded",
    502: "upstream failed",
    503: "Redis, policy or upstream unavailable, or the gateway is shutting down",
    504: "upstream timed out",
}
V1_ERRORS = (400, 401, 403, 404, 413, 429, 502, 503, 504)
SECURITY = [{"apiKey": []}, {"anthropicKey": []}]
OBJECTS = {"type": "array", "items": {"type": "object"}}
SSE_EVENT = {
    "type": "object",
    "properties": {"event": STRING, "data": STRING},
    "required": ["data"],
}


def _range(kind: str, low: float, high: float) -> Schema:
    return nullable({"type": kind, "minimum": low, "maximum": high})


DOOR_SCHEMAS: dict[str, Schema] = {
    "AnthropicError": obj(
        {
            "type": {"const": "error"},
            "error": obj({"type": STRING, "message": STRING}, ["type", "message"]),
        },
        ["type", "error"],
    ),
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
        {"model": MODEL_NAME, "messages": {"type": "array", "items": {"type": "object"}}},
        ["model", "messages"],
    ),
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
    "ModerationRequest": obj(
        {
            "input": {"anyOf": [NON_EMPTY, {"type": "array", "minItems": 1}]},
            "model": nullable(MODEL_NAME),
            "metadata": SAMPLING["metadata"],
        },
        ["input"],
    ),
    "Moderation": obj({"id": STRING, "model": STRING, "results": OBJECTS}, ["results"]),
    "SpeechRequest": obj(
        {
            "model": MODEL_NAME,
            "input": NON_EMPTY,
            "voice": {"anyOf": [NON_EMPTY, {"type": "object"}]},
            "response_format": nullable(STRING),
            "speed": _range("number", 0.25, 4),
            "stream": NOT_STREAMED,
            "metadata": SAMPLING["metadata"],
        },
        ["model", "input", "voice"],
    ),
    "Upload": obj(
        {
            "model": {**MODEL_NAME, "description": "sent before the file"},
            "file": {"type": "string", "format": "binary"},
            "prompt": STRING,
        },
        ["model", "file"],
    ),
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
    "OperationResult": {"type": "object", "description": "the provider's answer, as it sent it"},
}


def _errors(envelope: str, statuses: tuple[int, ...] = V1_ERRORS) -> dict[str, Any]:
    return {
        str(status): {
            "description": ERROR_REASONS[status],
            "content": {JSON: {"schema": ref(envelope)}},
        }
        for status in statuses
    }


def _post(
    summary: str,
    body: str,
    answer: dict[str, Any],
    *,
    envelope: str = "Error",
    body_type: str = JSON,
) -> dict[str, Any]:
    return {
        "summary": summary,
        "tags": ["v1"],
        "security": SECURITY,
        "requestBody": {"required": True, "content": {body_type: {"schema": ref(body)}}},
        "responses": {"200": {"description": "the answer", "content": answer}} | _errors(envelope),
    }


def _json(name: str) -> dict[str, Any]:
    return {JSON: {"schema": ref(name)}}


def _upload(what: str, answer: dict[str, Any]) -> dict[str, Any]:
    """A multipart upload passed through to the provider, its answer streamed back."""
    return {
        "post": _post(
            f"{what} of an upload, streamed through",
            "Upload",
            answer,
            body_type="multipart/form-data",
        )
    }


def door_paths() -> dict[str, Any]:
    binary = {"schema": {"type": "string", "format": "binary"}}
    text = {"text/plain": {"schema": STRING}}
    return {
        "/v1/messages": {
            "post": _post(
                "Anthropic Messages (x-api-key or bearer); stream: true for Anthropic's events",
                "MessagesRequest",
                _json("AnthropicMessage") | {SSE: {"schema": SSE_EVENT}},
                envelope="AnthropicError",
            )
        },
        "/v1/messages/count_tokens": {
            "post": _post(
                "Count a request's input tokens (Anthropic providers only; not charged)",
                "CountTokensRequest",
                _json("TokenCount"),
                envelope="AnthropicError",
            )
        },
        "/v1/responses": {
            "post": _post(
                "OpenAI Responses API, stateless (store: false)",
                "ResponsesRequest",
                _json("Response") | {SSE: {"schema": SSE_EVENT}},
            )
        },
        "/v1/moderations": {"post": _post("Moderation", "ModerationRequest", _json("Moderation"))},
        "/v1/audio/speech": {
            "post": _post(
                "Text to speech: the provider's audio bytes",
                "SpeechRequest",
                {"audio/*": binary, "application/octet-stream": binary},
            )
        },
        "/v1/audio/transcriptions": _upload("Transcription", _json("OperationResult") | text),
        "/v1/audio/translations": _upload("Translation", _json("OperationResult") | text),
        "/v1/images/edits": _upload("Image edit", _json("OperationResult")),
        "/v1/models/{model_id}": {
            "get": {
                "summary": "One model or alias this key may use",
                "tags": ["v1"],
                "security": SECURITY,
                "parameters": [
                    {"name": "model_id", "in": "path", "required": True, "schema": STRING}
                ],
                "responses": {"200": {"description": "the model", "content": _json("Model")}}
                | _errors("Error", (401, 404, 503)),
            }
        },
    }
