"""Streaming in no particular format: the events every format's stream parses into and renders from.

A stream is ``MessageStart``, then content blocks one after another (``BlockStart``, deltas,
``BlockStop``; never two open at once), then ``MessageDelta`` with the stop reason and the final
usage, then ``MessageStop``. ``StreamError`` may end a stream at any point. ``MessageDelta.usage``
is the whole stream's usage so far, not an increment, so the last one is what gets metered.

``StreamAccumulator`` rebuilds the ``ChatResponse`` a stream describes (what a non-streaming call
would have returned); it also checks the event order, so a parser's output can be trusted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.formats.errors import ErrorInfo, UpstreamProtocolError
from gateway.formats.internal import (
    Block,
    ChatResponse,
    Raw,
    RedactedThinking,
    Refusal,
    StopReason,
    Text,
    Thinking,
    ToolCall,
    Usage,
)

# The block kinds a stream can open; their deltas: text for Text and Refusal, JSON for a
# ToolCall's arguments, thinking text and a signature for Thinking, none for RedactedThinking,
# and the source format's own delta objects for a Raw block (which only that format renders).
StreamBlock = Text | ToolCall | Thinking | RedactedThinking | Refusal | Raw


@dataclass(frozen=True, slots=True)
class MessageStart:
    id: str
    model: str
    usage: Usage | None = None  # what is known at the start (Anthropic: the prompt's tokens)
    created: int | None = None


@dataclass(frozen=True, slots=True)
class BlockEvent:
    index: int  # the block's place in the response's content, from 0


@dataclass(frozen=True, slots=True)
class BlockStart(BlockEvent):
    block: StreamBlock  # its empty shell: ToolCall with id and name, Text(""), Thinking("")


@dataclass(frozen=True, slots=True)
class TextDelta(BlockEvent):
    text: str


@dataclass(frozen=True, slots=True)
class ArgumentsDelta(BlockEvent):
    json: str  # a piece of the tool call's arguments JSON


@dataclass(frozen=True, slots=True)
class ThinkingDelta(BlockEvent):
    text: str


@dataclass(frozen=True, slots=True)
class SignatureDelta(BlockEvent):
    signature: str


@dataclass(frozen=True, slots=True)
class RawDelta(BlockEvent):
    data: dict[str, Any]  # the source format's delta object, verbatim


@dataclass(frozen=True, slots=True)
class BlockStop(BlockEvent):
    pass


@dataclass(frozen=True, slots=True)
class MessageDelta:
    stop_reason: StopReason | None
    usage: Usage | None = None
    stop_sequence: str | None = None


@dataclass(frozen=True, slots=True)
class MessageStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamError:
    error: ErrorInfo


# The events that add to the open block.
BlockDelta = TextDelta | ArgumentsDelta | ThinkingDelta | SignatureDelta | RawDelta

StreamEvent = (
    MessageStart | BlockStart | BlockDelta | BlockStop | MessageDelta | MessageStop | StreamError
)


class StreamAccumulator:
    """Folds a stream's events into the response they describe, checking their order."""

    def __init__(self) -> None:
        self.response: ChatResponse | None = None
        self.error: ErrorInfo | None = None
        self.finished = False
        self._open: int | None = None
        self._blocks: dict[int, Block] = {}

    def add(self, event: StreamEvent) -> None:
        if isinstance(event, StreamError):
            self.error = event.error
            return
        if self.finished:
            raise UpstreamProtocolError(f"stream event {type(event).__name__} after MessageStop")
        if isinstance(event, MessageStart):
            if self.response is not None:
                raise UpstreamProtocolError("a second MessageStart in one stream")
            self.response = ChatResponse(
                id=event.id,
                model=event.model,
                content=[],
                stop_reason=None,
                usage=event.usage,
                created=event.created,
            )
            return
        response = self._started()
        if isinstance(event, BlockStart):
            if self._open is not None:
                raise UpstreamProtocolError("a block started while another was open")
            if event.index in self._blocks:
                raise UpstreamProtocolError(f"block index {event.index} used twice")
            block = _fresh(event.block)
            self._blocks[event.index] = block
            response.content.append(block)
            self._open = event.index
        elif isinstance(event, BlockStop):
            self._expect_open(event.index)
            self._open = None
        elif isinstance(event, MessageDelta):
            if self._open is not None:
                raise UpstreamProtocolError("MessageDelta while a block was open")
            response.stop_reason = event.stop_reason
            response.stop_sequence = event.stop_sequence
            if event.usage is not None:
                response.usage = event.usage
        elif isinstance(event, MessageStop):
            self.finished = True
        else:
            self._delta(event)

    def _delta(self, event: BlockDelta) -> None:
        block = self._expect_open(event.index)
        if isinstance(event, RawDelta) and isinstance(block, Raw):
            return  # a Raw block keeps the data it started with
        if isinstance(event, TextDelta) and isinstance(block, Text | Refusal):
            block.text += event.text
        elif isinstance(event, ArgumentsDelta) and isinstance(block, ToolCall):
            block.arguments += event.json
        elif isinstance(event, ThinkingDelta) and isinstance(block, Thinking):
            block.text += event.text
        elif isinstance(event, SignatureDelta) and isinstance(block, Thinking):
            block.signature = (block.signature or "") + event.signature
        else:
            raise UpstreamProtocolError(
                f"{type(event).__name__} does not fit a {type(block).__name__} block"
            )

    def _started(self) -> ChatResponse:
        if self.response is None:
            raise UpstreamProtocolError("stream event before MessageStart")
        return self.response

    def _expect_open(self, index: int) -> Block:
        if self._open != index:
            raise UpstreamProtocolError(f"event for block {index}, which is not the open block")
        return self._blocks[index]


def _fresh(block: StreamBlock) -> StreamBlock:
    """A copy of a start shell, so accumulating never mutates the event."""
    if isinstance(block, Text):
        return Text(block.text)
    if isinstance(block, Refusal):
        return Refusal(block.text)
    if isinstance(block, ToolCall):
        return ToolCall(block.id, block.name, block.arguments)
    if isinstance(block, Thinking):
        return Thinking(block.text, block.signature, block.item_id, block.origin)
    if isinstance(block, Raw):
        return Raw(block.format, dict(block.data))
    return RedactedThinking(block.data)


def accumulate(events: list[StreamEvent]) -> ChatResponse:
    """The response a complete stream describes; raises on a stream error or a broken order."""
    accumulator = StreamAccumulator()
    for event in events:
        accumulator.add(event)
    if accumulator.error is not None:
        raise UpstreamProtocolError(f"stream ended with an error: {accumulator.error.message}")
    if accumulator.response is None or not accumulator.finished:
        raise UpstreamProtocolError("stream ended before MessageStop")
    return accumulator.response
