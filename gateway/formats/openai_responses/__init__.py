"""OpenAI Responses API (``/v1/responses``), stateless: requests, answers, streams and errors.

The package is this format's ``WireFormat``: it exports the protocol's members.
"""

# Re-exports only: ``__all__`` is derived from ``WireFormat``, which ruff cannot read.
# ruff: noqa: F401

from gateway.formats.openai_errors import parse_error, render_error
from gateway.formats.openai_responses.request_parse import NAME, parse_request
from gateway.formats.openai_responses.request_render import check_portable, render_request
from gateway.formats.openai_responses.response import parse_response, render_response
from gateway.formats.openai_responses.stream_parse import StreamParser
from gateway.formats.openai_responses.stream_render import StreamRenderer, render_stream_error
from gateway.formats.wire import WIRE_FORMAT_MEMBERS

__all__ = [*WIRE_FORMAT_MEMBERS]
