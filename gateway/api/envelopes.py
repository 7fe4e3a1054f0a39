"""Errors in the client's own envelope: one function per place an error goes out.

Both OpenAI formats (Chat Completions, the Responses API) answer with the gateway's OpenAI
envelope exactly as ``GatewayError.body()`` writes it (its own ``type`` and ``code``); Anthropic
Messages answers ``{"type": "error", "error": {"type", "message"}}`` with the type that goes
with the status (``authentication_error`` for 401, ``rate_limit_error`` for 429, ...). A stream
that fails after its first byte ends with the client format's error event.
"""

from __future__ import annotations

import orjson
from starlette.responses import Response

from gateway.errors import GatewayError
from gateway.formats import wire_format
from gateway.formats.errors import ErrorInfo, kind_for_status
from gateway.formats.internal import FormatName
from gateway.formats.relay import StreamRelay

JSON = "application/json"
OPENAI_ENVELOPES: frozenset[FormatName] = frozenset({"openai_chat", "openai_responses"})


def error_info(exc: GatewayError) -> ErrorInfo:
    """A gateway error in no particular format (what its OpenAI body says)."""
    error = exc.body()["error"]
    kind = "billing" if error.get("type") == "insufficient_quota" else kind_for_status(exc.status)
    return ErrorInfo(
        exc.status, str(error.get("message") or exc.message), kind, error.get("code"), exc.param
    )


def error_body(client: FormatName, exc: GatewayError) -> bytes:
    if client in OPENAI_ENVELOPES:
        return exc.body_bytes()
    return orjson.dumps(wire_format(client).render_error(error_info(exc)))


def error_response(
    client: FormatName, exc: GatewayError, headers: dict[str, str] | None = None
) -> Response:
    merged = {**(headers or {}), **exc.headers}
    return Response(
        error_body(client, exc), status_code=exc.status, headers=merged, media_type=JSON
    )


def stream_error(client: FormatName, relay: StreamRelay | None, exc: GatewayError) -> bytes:
    """The event that ends a stream which failed after its first byte."""
    if client == "openai_chat":
        return b"event: error\ndata: " + exc.body_bytes() + b"\n\n"
    info = error_info(exc)
    if relay is not None:
        return relay.render_error(info)
    return wire_format(client).render_stream_error(info)
