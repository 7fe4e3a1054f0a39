"""Anthropic Messages (``/v1/messages``): requests, answers, streams and errors."""

from gateway.formats.anthropic_messages.errors import parse_error, render_error, render_stream_error
from gateway.formats.anthropic_messages.request_parse import NAME, parse_request
from gateway.formats.anthropic_messages.request_render import DEFAULT_MAX_TOKENS, render_request
from gateway.formats.anthropic_messages.response import parse_response, render_response
from gateway.formats.anthropic_messages.stream_parse import StreamParser
from gateway.formats.anthropic_messages.stream_render import StreamRenderer

__all__ = [
    "DEFAULT_MAX_TOKENS",
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
