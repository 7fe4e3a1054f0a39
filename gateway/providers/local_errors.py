"""The local provider's client errors: a 400 in OpenAI's shape, naming the parameter."""

from __future__ import annotations

from typing import Any

from gateway.errors import UpstreamError


def client_error(provider: str, message: str, param: str | None, code: str | None = None) -> Any:
    """A 400 the dispatcher passes straight to the client (no retry, no fallback)."""
    return UpstreamError(
        message,
        status=400,
        retryable=False,
        kind="status",
        provider=provider,
        upstream_body={
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": code,
            }
        },
    )
