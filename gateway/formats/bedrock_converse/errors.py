"""Bedrock's errors: an HTTP status, the exception's name and ``{"message": ...}``.

Bedrock Runtime names its exception in the ``x-amzn-ErrorType`` header (``ThrottlingException``
429, ``ValidationException`` 400, ``AccessDeniedException`` 403, ``ModelTimeoutException`` 408,
``ServiceUnavailableException`` 503 ...), so the HTTP status already says which kind of error it
is; a ConverseStream that fails mid-stream sends the exception as an event instead
(``{"throttlingException": {"message": ...}}``, named by its ``:exception-type``). A prompt
longer than the model's window reads as ``context_length_exceeded``, as at every provider.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.formats.errors import CONTEXT_LENGTH_EXCEEDED, ErrorInfo, ErrorKind, kind_for_status

# Exception name (first letter lower-case, as stream events name it) -> (status, kind).
EXCEPTIONS: dict[str, tuple[int, ErrorKind]] = {
    "validationException": (400, "invalid_request"),
    "accessDeniedException": (403, "permission"),
    "resourceNotFoundException": (404, "not_found"),
    "modelTimeoutException": (408, "timeout"),
    "conflictException": (409, "conflict"),
    "modelErrorException": (424, "api_error"),
    "throttlingException": (429, "rate_limit"),
    "modelNotReadyException": (429, "rate_limit"),
    "serviceQuotaExceededException": (429, "rate_limit"),
    "internalServerException": (500, "api_error"),
    "modelStreamErrorException": (424, "api_error"),
    "serviceUnavailableException": (503, "overloaded"),
}
_CONTEXT_MESSAGES = ("too long", "too many input tokens", "context length", "context window")


def parse_error(status: int | None, body: bytes | dict[str, Any]) -> ErrorInfo:
    """A Bedrock error body (``{"message"}``, or a stream's exception event) as an
    ``ErrorInfo``; a None status (mid-stream) takes the status of the exception named."""
    data: Any = body
    if isinstance(body, bytes):
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            data = None
    data = data if isinstance(data, dict) else {}
    exception = next((name for name in data if name in EXCEPTIONS), None)
    if exception is not None:
        inner = data[exception]
        data = inner if isinstance(inner, dict) else {}
    named = EXCEPTIONS.get(exception) if exception else None
    if status is None:
        status = named[0] if named else 500
    kind = named[1] if named and named[0] == status else kind_for_status(status)
    message = data.get("message") or data.get("Message")
    if not isinstance(message, str) or not message:
        message = f"upstream returned HTTP {status}"
    lowered = message.lower()
    code = exception
    if kind == "invalid_request" and any(words in lowered for words in _CONTEXT_MESSAGES):
        code = CONTEXT_LENGTH_EXCEEDED
    return ErrorInfo(status, message, kind, code=code)
