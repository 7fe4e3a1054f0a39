"""Bedrock's ``Converse`` API (one format for every model on Bedrock): requests, answers,
ConverseStream events and errors, for upstreams only.

No client speaks it (there is no Converse front door), so the package is an
``UpstreamFormat``: it exports that protocol's members. The binary event-stream framing of
ConverseStream is the provider's to decode (``providers/aws_eventstream.py``); this parser
reads the events it yields.
"""

# Re-exports only: ``__all__`` is derived from ``UpstreamFormat``, which ruff cannot read.
# ruff: noqa: F401

from gateway.formats.bedrock_converse.errors import parse_error
from gateway.formats.bedrock_converse.request_render import NAME, render_request
from gateway.formats.bedrock_converse.response import parse_response
from gateway.formats.bedrock_converse.stream_parse import StreamParser
from gateway.formats.upstream import UPSTREAM_FORMAT_MEMBERS

__all__ = [*UPSTREAM_FORMAT_MEMBERS]
