"""Gemini's ``generateContent`` (the Gemini API and Vertex AI alike): requests, answers,
streams and errors, for upstreams only.

No client speaks it (there is no Gemini front door), so the package is an ``UpstreamFormat``:
it exports that protocol's members.
"""

# Re-exports only: ``__all__`` is derived from ``UpstreamFormat``, which ruff cannot read.
# ruff: noqa: F401

from gateway.formats.gemini.errors import parse_error
from gateway.formats.gemini.request_render import NAME, render_request
from gateway.formats.gemini.response import parse_response
from gateway.formats.gemini.stream_parse import StreamParser
from gateway.formats.upstream import UPSTREAM_FORMAT_MEMBERS

__all__ = [*UPSTREAM_FORMAT_MEMBERS]
