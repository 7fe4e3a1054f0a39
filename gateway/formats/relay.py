"""An upstream's answer on its way to a client: passed through in the same format, or translated.

``stream_relay(client, upstream, request)`` gives the one object a gateway's stream relay
needs, whatever the pair of formats:

- ``feed(data)`` takes one SSE ``data`` payload from the upstream and returns the bytes for
  the client (possibly none);
- ``close()`` says the upstream's body ended and returns what is left to send;
- ``usage`` is the whole stream's usage so far, ``produced`` the number of output pieces seen
  (about one token each: the estimate when a stream ends before its usage), ``finished``
  whether the stream reached its format's end, ``error`` the error an upstream event reported
  (nothing of it is sent: the caller scrubs it and sends ``render_error(info)``), or the
  stream's early end;
- ``render_error(info)`` is the client format's error event for this stream.

When both formats are the same the upstream's bytes go out untouched (event names restored
from each payload's ``type``), read only for usage and the end; otherwise the upstream
format's ``StreamParser`` feeds the client format's ``StreamRenderer``. ``usage_of(format,
body)`` reads the usage of a whole (non-stream) answer of any format.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from gateway.formats import (
    UPSTREAM_ONLY_FORMATS,
    anthropic_messages,
    openai_chat,
    openai_responses,
    upstream_format,
)
from gateway.formats.errors import ErrorInfo, FormatError
from gateway.formats.internal import ChatRequest, FormatName, Usage
from gateway.formats.openai_chat.relay import ChatRelay, chat_usage
from gateway.formats.relay_progress import RelayProgress
from gateway.formats.sse import encode_sse
from gateway.formats.stream import (
    ArgumentsDelta,
    MessageStop,
    StreamError,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
)

_OUTPUT_EVENTS = (TextDelta, ArgumentsDelta, ThinkingDelta)


class StreamRelay(Protocol):
    usage: Usage | None
    produced: int
    finished: bool
    error: ErrorInfo | None

    def feed(self, data: bytes) -> bytes: ...

    def close(self) -> bytes: ...

    def render_error(self, info: ErrorInfo) -> bytes: ...


def _package(name: FormatName) -> Any:
    if name in UPSTREAM_ONLY_FORMATS:
        return upstream_format(name)  # a parser only: no client speaks it
    return {
        "openai_chat": openai_chat,
        "anthropic_messages": anthropic_messages,
        "openai_responses": openai_responses,
    }[name]


def stream_relay(
    client: FormatName, upstream: FormatName, request: ChatRequest | None = None
) -> StreamRelay:
    """The relay from an ``upstream``-format stream to a ``client``-format one. ``request`` is
    the client's request (Chat Completions' ``include_usage``, the Responses API's echo)."""
    if client == upstream == "openai_chat":
        return ChatRelay(include_usage=request.include_usage if request else None)
    if client == upstream:
        return ParsedRelay(client)
    return TranslatedRelay(client, upstream, request)


class ParsedRelay(RelayProgress):
    """The same format passed through (Anthropic, Responses): each payload is read by the
    format's parser for usage and the end, and relayed as it came, with its event name."""

    def __init__(self, name: FormatName) -> None:
        super().__init__()
        package = _package(name)
        self._parser = package.StreamParser()
        self._render_stream_error = package.render_stream_error

    def feed(self, data: bytes) -> bytes:
        if self.finished:
            return b""
        events = self._parser.feed(data)
        self.usage = self._parser.usage
        for event in events:
            if isinstance(event, StreamError):
                self.stop(event.error)
                return b""
            if isinstance(event, _OUTPUT_EVENTS):
                self.produced += 1
            elif isinstance(event, MessageStop):
                self.finished = True
        return encode_sse(data, _event_name(data))

    def render_error(self, info: ErrorInfo) -> bytes:
        return self._render_stream_error(info)


class TranslatedRelay(RelayProgress):
    """An upstream stream in one format rendered for a client of another; its parser reports
    an early end as a ``StreamError``."""

    def __init__(
        self, client: FormatName, upstream: FormatName, request: ChatRequest | None
    ) -> None:
        super().__init__()
        self._parser = _package(upstream).StreamParser()
        self._renderer = _package(client).StreamRenderer(request)

    def feed(self, data: bytes) -> bytes:
        if self.finished:
            return b""
        return self._render(self._parser.feed(data))

    def close(self) -> bytes:
        if self.finished:
            return b""
        return self._render(self._parser.close())

    def render_error(self, info: ErrorInfo) -> bytes:
        return self._renderer.render(StreamError(info))

    def _render(self, events: list[StreamEvent]) -> bytes:
        self.usage = self._parser.usage
        out = b""
        for event in events:
            if isinstance(event, StreamError):
                self.stop(event.error)
                return out
            if isinstance(event, _OUTPUT_EVENTS):
                self.produced += 1
            out += self._renderer.render(event)
            if isinstance(event, MessageStop):
                self.finished = True
                return out
        return out


def _event_name(data: bytes) -> str | None:
    """The SSE event name of an Anthropic or Responses payload: its ``type``."""
    payload = orjson.loads(data)  # the parser has just read it: valid JSON
    kind = payload.get("type") if isinstance(payload, dict) else None
    return kind if isinstance(kind, str) else None


def usage_of(name: FormatName, body: dict[str, Any]) -> Usage | None:
    """The usage a whole answer of format ``name`` reports; None when it has none (or one
    that is not readable: the gateway then estimates)."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return None
    try:
        if name == "anthropic_messages":
            return anthropic_messages.response.parse_usage(usage)
        if name == "openai_responses":
            return openai_responses.response.parse_usage(usage)
        return chat_usage(usage)
    except FormatError:
        return None
