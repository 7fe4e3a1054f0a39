"""Gemini's error envelope (Google's API errors): ``{"error": {"code", "message", "status"}}``.

``status`` is the canonical gRPC code name (``INVALID_ARGUMENT``, ``RESOURCE_EXHAUSTED`` ...),
which says more than the HTTP status where both are given; a prompt longer than the model's
window reads as ``context_length_exceeded``, so routing can act on it as on any provider's
(a blocked prompt is no error at Gemini: a 200 answer whose ``promptFeedback`` says why).
"""

from __future__ import annotations

from typing import Any

from gateway.formats.error_body import error_member, error_message
from gateway.formats.errors import (
    CONTEXT_LENGTH_EXCEEDED,
    ErrorInfo,
    ErrorKind,
    kind_for_status,
    status_for_kind,
)

_KINDS: dict[str, ErrorKind] = {
    "INVALID_ARGUMENT": "invalid_request",
    "FAILED_PRECONDITION": "invalid_request",
    "OUT_OF_RANGE": "invalid_request",
    "UNAUTHENTICATED": "authentication",
    "PERMISSION_DENIED": "permission",
    "NOT_FOUND": "not_found",
    "ALREADY_EXISTS": "conflict",
    "ABORTED": "conflict",
    "RESOURCE_EXHAUSTED": "rate_limit",
    "CANCELLED": "api_error",
    "UNKNOWN": "api_error",
    "INTERNAL": "api_error",
    "DATA_LOSS": "api_error",
    "UNIMPLEMENTED": "not_found",
    "UNAVAILABLE": "overloaded",
    "DEADLINE_EXCEEDED": "timeout",
}
# How Gemini says a prompt does not fit: "The input token count (N) exceeds the maximum
# number of tokens allowed (M)."
_CONTEXT_MESSAGES = ("input token count", "exceeds the maximum number of tokens")


def _key_refused(error: dict[str, Any]) -> bool:
    details = error.get("details")
    return isinstance(details, list) and any(
        isinstance(detail, dict) and detail.get("reason") == "API_KEY_INVALID" for detail in details
    )


def parse_error(status: int | None, body: bytes | dict[str, Any]) -> ErrorInfo:
    """A Gemini error body (any shape, even not JSON) as an ``ErrorInfo``; a None status (an
    error event mid-stream) takes the status of the error's code or canonical name."""
    error = error_member(body)
    error = error if isinstance(error, dict) else {}
    named = error.get("status")
    kind = _KINDS.get(named) if isinstance(named, str) else None
    if status is None:
        code = error.get("code")
        if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600:
            status = code
        else:
            status = status_for_kind(kind or "api_error")
    kind = kind or kind_for_status(status)
    message = error_message(error, status)
    lowered = message.lower()
    code_name: str | None = named.lower() if isinstance(named, str) else None
    if _key_refused(error):
        # Gemini answers a wrong API key with 400 INVALID_ARGUMENT: it is the credential.
        kind = "authentication"
    if kind == "invalid_request" and any(words in lowered for words in _CONTEXT_MESSAGES):
        code_name = CONTEXT_LENGTH_EXCEEDED
    return ErrorInfo(status, message, kind, code=code_name)
