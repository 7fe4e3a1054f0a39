"""What every format package offers, described once: the ``WireFormat`` protocol.

Each format package (``openai_chat``, ``anthropic_messages``, ``openai_responses``) is one
``WireFormat``: it exports exactly ``WIRE_FORMAT_MEMBERS`` (Anthropic adds its default
``max_tokens``), so the packages' exports and the protocol cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from gateway.formats.errors import ErrorInfo
from gateway.formats.internal import ChatRequest, ChatResponse
from gateway.formats.stream import StreamEvent


class StreamParserLike(Protocol):
    usage: Any

    def feed(self, data: bytes | str) -> list[StreamEvent]: ...

    def close(self) -> list[StreamEvent]: ...


class StreamRendererLike(Protocol):
    def render(self, event: StreamEvent) -> bytes: ...


class WireFormat(Protocol):
    NAME: str

    def parse_request(self, body: bytes | str | dict[str, Any]) -> ChatRequest: ...

    def check_portable(self, request: ChatRequest) -> None: ...

    def render_request(self, request: ChatRequest, model: str) -> dict[str, Any]: ...

    def parse_response(self, body: bytes | str | dict[str, Any]) -> ChatResponse: ...

    # Each format's answer and error envelope are TypedDicts of its own.
    def render_response(
        self, response: ChatResponse, request: ChatRequest | None = None
    ) -> Mapping[str, Any]: ...

    def StreamParser(self) -> StreamParserLike: ...

    def StreamRenderer(self, request: ChatRequest | None = None) -> StreamRendererLike: ...

    def parse_error(self, status: int | None, body: bytes | dict[str, Any]) -> ErrorInfo: ...

    def render_error(self, info: ErrorInfo) -> Mapping[str, Any]: ...

    def render_stream_error(self, info: ErrorInfo) -> bytes: ...


# The protocol's attribute and method names, in a stable order.
WIRE_FORMAT_MEMBERS: tuple[str, ...] = tuple(
    sorted({*WireFormat.__annotations__, *(name for name in vars(WireFormat) if name[0] != "_")})
)
