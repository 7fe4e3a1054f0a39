"""The upstream half of a wire format: what a format only upstreams speak offers.

Gemini's ``generateContent`` and Bedrock's ``Converse`` have no front door: no client sends
them, so their packages (``formats/gemini``, ``formats/bedrock_converse``) offer only the
upstream side of ``WireFormat``: render a request, parse an answer, a ``StreamParser`` for
its stream and a reader of its error bodies. Every client format offers these too, so
``upstream_format(name)`` serves the translation of any request to any provider.
"""

from __future__ import annotations

from typing import Any, Protocol

from gateway.formats.errors import ErrorInfo
from gateway.formats.internal import ChatRequest, ChatResponse
from gateway.formats.wire import StreamParserLike


class UpstreamFormat(Protocol):
    NAME: str

    def render_request(self, request: ChatRequest, model: str) -> dict[str, Any]: ...

    def parse_response(self, body: bytes | str | dict[str, Any]) -> ChatResponse: ...

    def StreamParser(self) -> StreamParserLike: ...

    def parse_error(self, status: int | None, body: bytes | dict[str, Any]) -> ErrorInfo: ...


# The protocol's attribute and method names, in a stable order.
UPSTREAM_FORMAT_MEMBERS: tuple[str, ...] = tuple(
    sorted(
        {
            *UpstreamFormat.__annotations__,
            *(name for name in vars(UpstreamFormat) if name[0] != "_"),
        }
    )
)
