"""Anthropic's error envelope: ``{"type": "error", "error": {"type", "message"}}``.

The error types and their statuses are Anthropic's documented ones (400 invalid_request_error,
401 authentication_error, 402 billing_error, 403 permission_error, 404 not_found_error,
413 request_too_large, 429 rate_limit_error, 500 api_error, 504 timeout_error,
529 overloaded_error). Anthropic has no ``param``: the message already names the field.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

import orjson

from gateway.formats.error_body import error_member, error_message
from gateway.formats.errors import (
    CONTEXT_LENGTH_EXCEEDED,
    ErrorInfo,
    ErrorKind,
    kind_for_status,
    status_for_kind,
)
from gateway.formats.sse import encode_sse

_TYPES: dict[ErrorKind, str] = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "billing": "billing_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "conflict": "invalid_request_error",
    "request_too_large": "request_too_large",
    "rate_limit": "rate_limit_error",
    "api_error": "api_error",
    "overloaded": "overloaded_error",
    "timeout": "timeout_error",
}
_KINDS: dict[str, ErrorKind] = {
    error_type: kind for kind, error_type in _TYPES.items() if kind != "conflict"
}
# How Anthropic says a prompt does not fit the model's context window.
_CONTEXT_MESSAGES = ("prompt is too long", "exceed context limit", "context window")


class AnthropicErrorDetail(TypedDict):
    type: str
    message: str


class AnthropicErrorEnvelope(TypedDict):
    """Anthropic's error envelope, in which the gateway answers every error on /v1/messages."""

    type: Literal["error"]
    error: AnthropicErrorDetail


def render_error(info: ErrorInfo) -> AnthropicErrorEnvelope:
    return {"type": "error", "error": {"type": _TYPES[info.kind], "message": info.message}}


def render_stream_error(info: ErrorInfo) -> bytes:
    return encode_sse(orjson.dumps(render_error(info)), "error")


def parse_error(status: int | None, body: bytes | dict[str, Any]) -> ErrorInfo:
    """An Anthropic-format error body (any shape, even not JSON) as an ``ErrorInfo``; a None
    status (an ``error`` event mid-stream) takes the status of the error's type."""
    error = error_member(body)
    error = error if isinstance(error, dict) else {}
    kind = _KINDS.get(error.get("type"))  # type: ignore[arg-type]
    if status is None:
        kind = kind or "api_error"
        status = status_for_kind(kind)
    kind = kind or kind_for_status(status)
    message = error_message(error, status)
    lowered = message.lower()
    code = CONTEXT_LENGTH_EXCEEDED if any(m in lowered for m in _CONTEXT_MESSAGES) else None
    return ErrorInfo(status, message, kind, code=code)
