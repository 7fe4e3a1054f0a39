"""OpenAI Chat Completions (``/v1/chat/completions``): requests, answers, streams and errors."""

from gateway.formats.openai_chat.request_parse import NAME, parse_request
from gateway.formats.openai_chat.request_render import render_request
from gateway.formats.openai_chat.response import parse_response, render_response
from gateway.formats.openai_chat.stream_parse import StreamParser
from gateway.formats.openai_chat.stream_render import StreamRenderer
from gateway.formats.openai_errors import parse_error, render_error, render_stream_error

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
