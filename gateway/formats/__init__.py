"""Wire formats: every client and upstream format translated through one internal shape.

Each format package (``openai_chat``, ``anthropic_messages``, ``openai_responses``) offers the
same functions, described by ``WireFormat``: parse a client's request into a ``ChatRequest``
and render one for an upstream; parse an upstream's answer into a ``ChatResponse`` and render
one for a client; a ``StreamParser`` and a ``StreamRenderer`` for SSE; and its error envelope.
A request goes source -> internal -> target, whatever the pair: no pair has its own code.
When source and target are the same format the gateway relays bodies untouched instead.

This package depends on nothing else in the gateway (no HTTP, routing or providers).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Protocol, cast

from gateway.formats import anthropic_messages, openai_chat, openai_responses
from gateway.formats.errors import ErrorInfo
from gateway.formats.internal import ChatRequest, ChatResponse, FormatName
from gateway.formats.stream import StreamEvent

FORMAT_NAMES: tuple[FormatName, ...] = ("openai_chat", "anthropic_messages", "openai_responses")


class StreamParserLike(Protocol):
    usage: Any

    def feed(self, data: bytes | str) -> list[StreamEvent]: ...

    def close(self) -> list[StreamEvent]: ...


class StreamRendererLike(Protocol):
    def render(self, event: StreamEvent) -> bytes: ...


class WireFormat(Protocol):
    NAME: str

    def parse_request(self, body: bytes | str | dict[str, Any]) -> ChatRequest: ...

    def render_request(self, request: ChatRequest, model: str) -> dict[str, Any]: ...

    def parse_response(self, body: bytes | str | dict[str, Any]) -> ChatResponse: ...

    def render_response(
        self, response: ChatResponse, request: ChatRequest | None = None
    ) -> dict[str, Any]: ...

    def StreamParser(self) -> StreamParserLike: ...

    def StreamRenderer(self, request: ChatRequest | None = None) -> StreamRendererLike: ...

    def parse_error(self, status: int | None, body: bytes | dict[str, Any]) -> ErrorInfo: ...

    def render_error(self, info: ErrorInfo) -> dict[str, Any]: ...

    def render_stream_error(self, info: ErrorInfo) -> bytes: ...


def wire_format(name: FormatName) -> WireFormat:
    """The package of one format by name."""
    modules: dict[str, ModuleType] = {
        "openai_chat": openai_chat,
        "anthropic_messages": anthropic_messages,
        "openai_responses": openai_responses,
    }
    if name not in modules:
        raise ValueError(f"unknown wire format {name!r}; known: {', '.join(FORMAT_NAMES)}")
    return cast(WireFormat, modules[name])


__all__ = ["FORMAT_NAMES", "WireFormat", "wire_format"]
