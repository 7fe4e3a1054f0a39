"""Gemini streams (``streamGenerateContent?alt=sse``) into internal events.

Each SSE ``data`` payload is a whole ``GenerateContentResponse`` holding the next parts of the
first candidate: text arrives in pieces, a function call whole. Consecutive text parts (or
thought parts) continue one block; any other part closes it. ``usageMetadata`` is cumulative
in each chunk, and the chunk with a ``finishReason`` is the candidate's last. Gemini sends no
end event: the stream ends with its body, so the stop and the final usage are sent on
``close()`` once a finish reason was seen, and a body that ends before one was cut short.
An ``{"error": ...}`` payload ends the stream with that error.
"""

from __future__ import annotations

from typing import Any

from gateway.formats import stream
from gateway.formats.errors import UpstreamProtocolError
from gateway.formats.gemini.errors import parse_error
from gateway.formats.gemini.response import (
    blocked_reason,
    candidate_parts,
    first_candidate,
    parse_part,
    parse_stop,
    parse_usage,
    response_id,
)
from gateway.formats.internal import Block, Refusal, Text, Thinking, ToolCall
from gateway.formats.stream_parser import BaseStreamParser

NAME = "gemini"


class StreamParser(BaseStreamParser):
    """Feed each SSE ``data`` payload; ``close()`` when the upstream's stream ends."""

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._index = -1  # the last block's index
        self._open: Text | Thinking | None = None  # the block that the next piece extends
        self._stop: str | None = None  # Gemini's finish reason, once sent
        self._content: list[Block] = []  # what decides the stop reason (a call: tool_use)

    def _event(self, payload: Any) -> list[stream.StreamEvent]:
        if not isinstance(payload, dict):
            raise UpstreamProtocolError("upstream sent a stream chunk that is not an object")
        if isinstance(payload.get("error"), dict):
            self._finished = True
            return [stream.StreamError(parse_error(None, payload))]
        events: list[stream.StreamEvent] = []
        if not self._started:
            self._started = True
            model = str(payload.get("modelVersion") or "")
            events.append(stream.MessageStart(id=response_id(payload), model=model))
        usage = payload.get("usageMetadata")
        if isinstance(usage, dict):
            self.usage = parse_usage(usage)
        candidate = first_candidate(payload)
        if candidate is None:
            if self._stop is None and isinstance(payload.get("promptFeedback"), dict):
                events.extend(self._blocked(payload))
            return events
        for part in candidate_parts(candidate):
            for block in parse_part(part):
                events.extend(self._block(block))
        reason = candidate.get("finishReason")
        if isinstance(reason, str):
            self._stop = reason
            events.extend(self._close_open())
        return events

    def close(self) -> list[stream.StreamEvent]:
        if self._finished or self._stop is None:
            return super().close()  # nothing after the end; else the body ended early
        self._finished = True
        stop = "refusal" if self._stop == "BLOCKED" else parse_stop(self._stop, self._content)
        return [*self._close_open(), stream.MessageDelta(stop, self.usage), stream.MessageStop()]

    def _blocked(self, payload: dict[str, Any]) -> list[stream.StreamEvent]:
        self._stop = "BLOCKED"
        self._index += 1
        refusal = Refusal("")
        return [
            stream.BlockStart(self._index, refusal),
            stream.TextDelta(self._index, blocked_reason(payload)),
            stream.BlockStop(self._index),
        ]

    def _block(self, block: Block) -> list[stream.StreamEvent]:
        self._content.append(block)
        open_block = self._open
        if isinstance(block, Text) and isinstance(open_block, Text):
            return [stream.TextDelta(self._index, block.text)] if block.text else []
        if (
            isinstance(block, Thinking)
            and isinstance(open_block, Thinking)
            and not open_block.signature
        ):
            return self._thinking_pieces(block)
        events = self._close_open()
        self._index += 1
        index = self._index
        if isinstance(block, Text):
            self._open = block
            events.append(stream.BlockStart(index, Text("")))
            if block.text:
                events.append(stream.TextDelta(index, block.text))
        elif isinstance(block, Thinking):
            self._open = Thinking("", origin=NAME)
            events.append(stream.BlockStart(index, Thinking("", origin=NAME)))
            events.extend(self._thinking_pieces(block))
        elif isinstance(block, ToolCall):
            events.append(stream.BlockStart(index, ToolCall(block.id, block.name, "")))
            events.append(stream.ArgumentsDelta(index, block.arguments))
            events.append(stream.BlockStop(index))
        else:
            events.append(stream.BlockStart(index, block))  # type: ignore[arg-type]
            events.append(stream.BlockStop(index))
        return events

    def _thinking_pieces(self, block: Thinking) -> list[stream.StreamEvent]:
        events: list[stream.StreamEvent] = []
        if block.text:
            events.append(stream.ThinkingDelta(self._index, block.text))
        if block.signature:
            # A signature ends its thought: what follows is another block.
            events.append(stream.SignatureDelta(self._index, block.signature))
            assert isinstance(self._open, Thinking)
            self._open.signature = block.signature
        return events

    def _close_open(self) -> list[stream.StreamEvent]:
        if self._open is None:
            return []
        self._open = None
        return [stream.BlockStop(self._index)]
