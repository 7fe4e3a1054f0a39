"""Anthropic Messages streams from upstreams: SSE events into internal events.

Anthropic's events map one to one onto the internal ones (``message_start``,
``content_block_start/delta/stop``, ``message_delta``, ``message_stop``, ``error``); ``ping`` is
dropped. Usage arrives in two parts: the prompt's tokens in ``message_start`` and cumulative
output (sometimes updated input) counts in ``message_delta``; the parser merges them so every
``MessageDelta`` carries the whole usage. Blocks the shape does not model (server tools) pass as
``Raw`` with their deltas verbatim, which only this format renders.
"""

from __future__ import annotations

from typing import Any

from gateway.formats import stream
from gateway.formats.anthropic_messages.errors import parse_error
from gateway.formats.anthropic_messages.response import parse_block, parse_stop, parse_usage
from gateway.formats.errors import UpstreamProtocolError
from gateway.formats.internal import Raw, Text, Thinking, ToolCall
from gateway.formats.stream_parser import BaseStreamParser

NAME = "anthropic_messages"


class StreamParser(BaseStreamParser):
    """Feed each SSE ``data`` payload; ``close()`` when the upstream's stream ends."""

    def __init__(self) -> None:
        super().__init__()
        self._blocks: dict[int, Any] = {}  # index -> the block it started

    def _event(self, event: Any) -> list[stream.StreamEvent]:
        if not isinstance(event, dict):
            raise UpstreamProtocolError("upstream sent a stream event that is not an object")
        kind = event.get("type")
        if kind == "message_start":
            return [self._start(event)]
        if kind == "content_block_start":
            return self._block_start(event)
        if kind == "content_block_delta":
            return self._block_delta(event)
        if kind == "content_block_stop":
            return [stream.BlockStop(self._index(event))]
        if kind == "message_delta":
            delta = event.get("delta") or {}
            usage = event.get("usage")
            if isinstance(usage, dict):
                self.usage = parse_usage(usage, self.usage)
            stop = delta.get("stop_sequence")
            return [
                stream.MessageDelta(
                    parse_stop(delta.get("stop_reason")),
                    self.usage,
                    stop if isinstance(stop, str) else None,
                )
            ]
        if kind == "message_stop":
            self._finished = True
            return [stream.MessageStop()]
        if kind == "error":
            self._finished = True
            return [stream.StreamError(parse_error(None, event))]
        return []  # ping, and event types newer than this parser

    def _start(self, event: dict[str, Any]) -> stream.MessageStart:
        message = event.get("message")
        if not isinstance(message, dict):
            raise UpstreamProtocolError("upstream message_start has no message")
        usage = message.get("usage")
        if isinstance(usage, dict):
            self.usage = parse_usage(usage)
        return stream.MessageStart(
            id=str(message.get("id") or ""), model=str(message.get("model") or ""), usage=self.usage
        )

    def _index(self, event: dict[str, Any]) -> int:
        index = event.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            raise UpstreamProtocolError(f"upstream {event.get('type')} has no index")
        return index

    def _block_start(self, event: dict[str, Any]) -> list[stream.StreamEvent]:
        index = self._index(event)
        block = parse_block(event.get("content_block"))
        self._blocks[index] = block
        if isinstance(block, Text) and block.text:
            return [stream.BlockStart(index, Text("")), stream.TextDelta(index, block.text)]
        if isinstance(block, Thinking):
            shell = Thinking("", origin=NAME)
            events: list[stream.StreamEvent] = [stream.BlockStart(index, shell)]
            if block.text:
                events.append(stream.ThinkingDelta(index, block.text))
            if block.signature:
                events.append(stream.SignatureDelta(index, block.signature))
            return events
        if isinstance(block, ToolCall):
            events = [stream.BlockStart(index, ToolCall(block.id, block.name, ""))]
            if block.arguments not in ("", "{}"):
                events.append(stream.ArgumentsDelta(index, block.arguments))
            return events
        return [stream.BlockStart(index, block)]

    def _block_delta(self, event: dict[str, Any]) -> list[stream.StreamEvent]:
        index = self._index(event)
        delta = event.get("delta")
        if not isinstance(delta, dict):
            raise UpstreamProtocolError("upstream content_block_delta has no delta")
        if isinstance(self._blocks.get(index), Raw):
            return [stream.RawDelta(index, delta)]
        kind = delta.get("type")
        fields = {
            "text_delta": ("text", stream.TextDelta),
            "input_json_delta": ("partial_json", stream.ArgumentsDelta),
            "thinking_delta": ("thinking", stream.ThinkingDelta),
            "signature_delta": ("signature", stream.SignatureDelta),
        }
        if kind not in fields:
            return []  # citations: no other format has them
        key, event_type = fields[kind]
        value = delta.get(key)
        if not isinstance(value, str):
            raise UpstreamProtocolError(f"upstream {kind} has no {key}")
        return [event_type(index, value)]
