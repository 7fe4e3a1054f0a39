"""OpenAI's error envelope, shared by Chat Completions and the Responses API.

``{"error": {"message", "type", "param", "code"}}``; the type and default code for each error
kind are the ones the gateway's own OpenAI errors use, so a translated upstream error reads like
any other gateway error. Parsing recognises the cross-format codes routing acts on
(``context_length_exceeded``, ``content_filter``).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import ErrorEnvelope
from gateway.formats.error_body import error_member, error_message
from gateway.formats.errors import (
    CONTENT_FILTER,
    CONTEXT_LENGTH_EXCEEDED,
    ErrorInfo,
    ErrorKind,
    kind_for_status,
)
from gateway.formats.sse import encode_sse

# kind -> (OpenAI error type, default code)
_TYPES: dict[ErrorKind, tuple[str, str | None]] = {
    "invalid_request": ("invalid_request_error", None),
    "authentication": ("invalid_request_error", "invalid_api_key"),
    "billing": ("insufficient_quota", "insufficient_quota"),
    "permission": ("invalid_request_error", "permission_denied"),
    "not_found": ("invalid_request_error", "not_found"),
    "conflict": ("invalid_request_error", "conflict"),
    "request_too_large": ("invalid_request_error", "request_too_large"),
    "rate_limit": ("rate_limit_exceeded", "rate_limit_exceeded"),
    "api_error": ("server_error", None),
    "overloaded": ("service_unavailable", "service_unavailable"),
    "timeout": ("upstream_timeout", "upstream_timeout"),
}
_CONTENT_FILTER_CODES = frozenset({"content_filter", "content_policy_violation"})


def render_error(info: ErrorInfo) -> ErrorEnvelope:
    error_type, default_code = _TYPES[info.kind]
    return {
        "error": {
            "message": info.message,
            "type": error_type,
            "param": info.param,
            "code": info.code if info.code is not None else default_code,
        }
    }


def render_stream_error(info: ErrorInfo) -> bytes:
    """The SSE event that ends a stream which failed after its first byte (the gateway's form)."""
    return encode_sse(orjson.dumps(render_error(info)), "error")


def parse_error(status: int | None, body: bytes | dict[str, Any]) -> ErrorInfo:
    """An OpenAI-format error body (any shape, even not JSON) as an ``ErrorInfo``; a None
    status (an error mid-stream) is 429 for rate limits and 500 otherwise."""
    error = error_member(body)
    if status is None:
        limited = isinstance(error, dict) and "rate_limit" in str(
            error.get("type") or error.get("code")
        )
        status = 429 if limited else 500
    if not isinstance(error, dict):
        return ErrorInfo.for_status(status, f"upstream returned HTTP {status}")
    message = error_message(error, status)
    code = error.get("code") if isinstance(error.get("code"), str) else None
    param = error.get("param") if isinstance(error.get("param"), str) else None
    kind = kind_for_status(status)
    if error.get("type") == "insufficient_quota":
        kind = "billing"
    if code == CONTEXT_LENGTH_EXCEEDED or "maximum context length" in message:
        code = CONTEXT_LENGTH_EXCEEDED
    elif code in _CONTENT_FILTER_CODES:
        code = CONTENT_FILTER
    return ErrorInfo(status, message, kind, code=code, param=param)
