"""OpenAI Responses API (``/v1/responses``), stateless: requests, answers, streams and errors."""

from gateway.formats.openai_errors import parse_error, render_error
from gateway.formats.openai_responses.request import NAME, parse_request, render_request
from gateway.formats.openai_responses.response import parse_response, render_response
from gateway.formats.openai_responses.stream import (
    StreamParser,
    StreamRenderer,
    render_stream_error,
)

__all__ = [
    "NAME",
    "StreamParser",
    "StreamRenderer",
    "parse_error",
    "parse_request",
    "parse_response",
    "render_error",
    "render_request",
    "render_response",
    "render_stream_error",
]
