"""Anthropic Messages (``/v1/messages``): requests, answers, streams and errors.

The package is this format's ``WireFormat``: it exports the protocol's members.
"""

# Re-exports only: ``__all__`` is derived from ``WireFormat``, which ruff cannot read.
# ruff: noqa: F401

from gateway.formats.anthropic_messages.errors import parse_error, render_error, render_stream_error
from gateway.formats.anthropic_messages.request_parse import NAME, parse_request
from gateway.formats.anthropic_messages.request_render import (
    DEFAULT_MAX_TOKENS,
    check_portable,
    render_request,
)
from gateway.formats.anthropic_messages.response import parse_response, render_response
from gateway.formats.anthropic_messages.stream_parse import StreamParser
from gateway.formats.anthropic_messages.stream_render import StreamRenderer
from gateway.formats.wire import WIRE_FORMAT_MEMBERS

__all__ = [*WIRE_FORMAT_MEMBERS, "DEFAULT_MAX_TOKENS"]
