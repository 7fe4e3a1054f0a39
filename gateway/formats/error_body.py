"""Reading an upstream's error body, whatever its shape: what every format's envelope shares.

OpenAI's and Anthropic's envelopes both keep the error object under ``error`` with a
``message``. An upstream may still answer with a body that is not JSON, not an object or
has no message; the error then reads as its HTTP status alone, never as a parse failure.
"""

from __future__ import annotations

from typing import Any

import orjson


def error_member(body: bytes | dict[str, Any]) -> Any:
    """The body's ``error`` member (any JSON value), or None when there is none."""
    data: Any = body
    if isinstance(body, bytes):
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            data = None
    return data.get("error") if isinstance(data, dict) else None


def error_message(error: dict[str, Any], status: int) -> str:
    """The error's own message, or one naming the status when it has none."""
    message = error.get("message")
    if not isinstance(message, str) or not message:
        return f"upstream returned HTTP {status}"
    return message
