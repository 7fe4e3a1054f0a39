"""Failures of translation, and one error record that every format's envelope renders.

``MalformedRequest`` is bad client input (400), naming the field by its path in the client's own
format (``messages[2].content[0].source``). ``Untranslatable`` is valid input that the target
format cannot carry faithfully (400, names the field and the target). ``UpstreamProtocolError``
is an upstream body or event that breaks its own format (the gateway answers 502). ``ErrorInfo``
is an error in no format: front doors render it in their envelope, and each format can parse
its own error bodies into it, so an upstream's error reaches a client in the client's format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ErrorKind = Literal[
    "invalid_request",
    "authentication",
    "billing",
    "permission",
    "not_found",
    "conflict",
    "request_too_large",
    "rate_limit",
    "api_error",
    "overloaded",
    "timeout",
]

# Codes that mean the same thing in every format, so that routing can act on them.
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
CONTENT_FILTER = "content_filter"


class FormatError(Exception):
    """Base of every translation failure; ``status`` is the HTTP status the gateway answers."""

    status = 400
    kind: ErrorKind = "invalid_request"
    default_code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code

    def info(self) -> ErrorInfo:
        return ErrorInfo(self.status, self.message, self.kind, code=self.code, param=self.param)


class MalformedRequest(FormatError):
    """The client's body breaks its own format; ``param`` is the path of the offending field."""


class Untranslatable(MalformedRequest):
    """Valid in the client's format, but the target format has no faithful way to carry it."""

    default_code = "unsupported_parameter"

    def __init__(self, param: str, target: str, why: str = "") -> None:
        reason = f": {why}" if why else ""
        super().__init__(f"{param} cannot be sent to a {target} upstream{reason}", param=param)
        self.target = target


class UpstreamProtocolError(FormatError):
    """An upstream answered with a body or event that its own format does not allow."""

    status = 502
    kind: ErrorKind = "api_error"
    default_code = "upstream_protocol_error"


_KIND_BY_STATUS: dict[int, ErrorKind] = {
    400: "invalid_request",
    401: "authentication",
    402: "billing",
    403: "permission",
    404: "not_found",
    409: "conflict",
    413: "request_too_large",
    422: "invalid_request",
    429: "rate_limit",
    503: "overloaded",
    504: "timeout",
    529: "overloaded",
}


_STATUS_BY_KIND: dict[ErrorKind, int] = {
    "invalid_request": 400,
    "authentication": 401,
    "billing": 402,
    "permission": 403,
    "not_found": 404,
    "conflict": 409,
    "request_too_large": 413,
    "rate_limit": 429,
    "api_error": 500,
    "overloaded": 529,
    "timeout": 504,
}


def status_for_kind(kind: ErrorKind) -> int:
    """The status an error of this kind has where the wire gave none (an error mid-stream)."""
    return _STATUS_BY_KIND[kind]


def kind_for_status(status: int) -> ErrorKind:
    """The error kind an HTTP status stands for when the body says nothing more precise."""
    if status in _KIND_BY_STATUS:
        return _KIND_BY_STATUS[status]
    return "invalid_request" if 400 <= status < 500 else "api_error"


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """An error in no particular format. ``code`` carries cross-format codes such as
    ``context_length_exceeded`` and ``content_filter``, or a format's own code."""

    status: int
    message: str
    kind: ErrorKind
    code: str | None = None
    param: str | None = None

    @classmethod
    def for_status(
        cls, status: int, message: str, *, code: str | None = None, param: str | None = None
    ) -> ErrorInfo:
        return cls(status, message, kind_for_status(status), code=code, param=param)
