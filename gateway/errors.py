"""OpenAI's error envelope, one exception type per HTTP outcome.

Every failure that reaches a client is one of these, rendered as
``{"error": {"message", "type", "param", "code"}}`` (``ErrorEnvelope``) with the matching
status. Nothing else (no stack trace, no secret) is ever sent. A value the client sent is
quoted in a message only through ``echo`` (cut to ``ECHO_CHARS``), and no message or param is
ever longer than ``MAX_MESSAGE_CHARS``: a 1 MB model name is not sent back whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, TypedDict

import orjson

if TYPE_CHECKING:
    from pydantic import ValidationError

ECHO_CHARS = 80
MAX_MESSAGE_CHARS = 1000
MAX_PARAM_CHARS = 200
_MAX_NAME_CHARS = 100  # a field name in a path of a refused input


def echo(value: object, limit: int = ECHO_CHARS) -> str:
    """``value`` quoted for an error message, cut to ``limit`` characters with its length said."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return repr(text) if isinstance(value, str) else text
    cut = repr(text[:limit]) if isinstance(value, str) else text[:limit]
    return f"{cut}... ({len(text)} characters)"


def clip(text: str, limit: int) -> str:
    """A message or param cut to ``limit`` characters (the last resort behind ``echo``)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ErrorDetail(TypedDict):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorEnvelope(TypedDict):
    """OpenAI's error envelope, in which the gateway answers every error (but on
    /v1/messages, in Anthropic's)."""

    error: ErrorDetail


class GatewayError(Exception):
    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        message = clip(message, MAX_MESSAGE_CHARS)
        super().__init__(message)
        self.message = message
        self.param = clip(param, MAX_PARAM_CHARS) if param is not None else None
        self.code = code if code is not None else self.default_code
        self.type = error_type or self.error_type
        self.headers = dict(headers or {})

    def body(self) -> ErrorEnvelope:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def body_bytes(self) -> bytes:
        return orjson.dumps(self.body())


class InvalidRequest(GatewayError):
    status = 400
    error_type = "invalid_request_error"


class AuthenticationFailed(GatewayError):
    status = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    error_type = "invalid_request_error"
    default_code = "permission_denied"


class NotFound(GatewayError):
    status = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    error_type = "invalid_request_error"
    default_code = "method_not_allowed"


class Conflict(GatewayError):
    status = 409
    error_type = "invalid_request_error"
    default_code = "conflict"


class PayloadTooLarge(GatewayError):
    status = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class RateLimited(GatewayError):
    """Our own limits. ``error_type`` tells ``rate_limit_exceeded`` from ``insufficient_quota``."""

    status = 429
    error_type = "rate_limit_exceeded"
    default_code = "rate_limit_exceeded"


class ServiceUnavailable(GatewayError):
    status = 503
    error_type = "service_unavailable"
    default_code = "service_unavailable"


class UpstreamError(GatewayError):
    """A provider failed. ``retryable`` drives retries and fallbacks before any byte is sent."""

    status = 502
    error_type = "upstream_error"
    default_code = "upstream_unavailable"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = True,
        retry_after_s: float | None = None,
        kind: str = "connect",
        provider: str | None = None,
        upstream_body: dict[str, Any] | None = None,
        final: bool = False,
        upstream_status: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        # No other candidate may be tried: the request cannot be sent again (an upload that
        # was already streamed to this one).
        self.final = final
        if status is not None:
            self.status = status  # type: ignore[misc]
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.kind = kind  # connect | timeout | status | protocol
        self.provider = provider
        self.upstream_body = upstream_body
        # The HTTP status the upstream answered with (None: no answer), as opposed to
        # ``status``, what the client gets; a fleet fails over on a replica's 503.
        self.upstream_status = upstream_status

    def body(self) -> ErrorEnvelope:
        # An upstream 4xx is passed through with its own message, type and code (each built
        # as text or None where the error was made: ``upstream_body``).
        if self.upstream_body and isinstance(self.upstream_body.get("error"), dict):
            upstream = self.upstream_body["error"]
            return {
                "error": {
                    "message": upstream.get("message") or self.message,
                    "type": upstream.get("type") or self.type,
                    "param": upstream.get("param"),
                    "code": upstream.get("code"),
                }
            }
        return super().body()


class UpstreamTimeout(UpstreamError):
    status = 504
    error_type = "upstream_timeout"
    default_code = "upstream_timeout"

    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("kind", "timeout")
        super().__init__(message, **kwargs)


def field_path(location: tuple[Any, ...]) -> str:
    """pydantic's error location as ``models[2].name`` (validator frames left out)."""
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not path:
            path = str(part)[:_MAX_NAME_CHARS]
        elif not str(part).startswith(("function-", "constrained-")):
            path += f".{str(part)[:_MAX_NAME_CHARS]}"
    return path


def invalid_input(error: ValidationError, unknown: str) -> InvalidRequest:
    """A refused typed input as the 400 naming its first bad field; ``unknown`` is what an
    extra name is called (``unknown field``, ``unknown query parameter``)."""
    first = error.errors(include_input=False, include_url=False)[0]
    path = field_path(first["loc"])
    message = unknown if first["type"] == "extra_forbidden" else first["msg"]
    message = message.removeprefix("Value error, ")
    return InvalidRequest(f"{path}: {message}" if path else message, param=path or None)
