"""Anthropic Messages streams for clients: internal events into Anthropic's SSE events.

Blocks are re-numbered from 0. When the upstream told the prompt's usage only at the end (the
OpenAI formats), ``message_start`` carries zeros and ``message_delta`` the real counts, whose
values replace the start's in Anthropic's own accumulation.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.formats import internal, stream
from gateway.formats.anthropic_messages.errors import render_stream_error
from gateway.formats.anthropic_messages.response import render_stop, render_usage
from gateway.formats.portability import raw_output
from gateway.formats.signatures import for_client
from gateway.formats.sse import encode_sse

NAME = "anthropic_messages"


class StreamRenderer:
    """Renders internal stream events as Anthropic SSE bytes for one client."""

    def __init__(self, request: internal.ChatRequest | None = None) -> None:
        self._indexes: dict[int, int] = {}  # internal block index -> this stream's index
        self._usage = internal.Usage()
        # Another provider's reasoning proof, gathered to be sent wrapped at the block's end.
        self._foreign: dict[int, internal.Thinking] = {}

    def render(self, event: stream.StreamEvent) -> bytes:
        if isinstance(event, stream.MessageStart):
            self._usage = event.usage or internal.Usage()
            message = {
                "id": event.id,
                "type": "message",
                "role": "assistant",
                "model": event.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": render_usage(self._usage),
            }
            return _event("message_start", {"message": message})
        if isinstance(event, stream.BlockStart):
            return self._block_start(event)
        if isinstance(event, stream.BlockStop):
            index = self._indexes[event.index]
            out = b""
            foreign = self._foreign.pop(event.index, None)
            signature = for_client(foreign, NAME) if foreign is not None else None
            if signature:
                delta = {"type": "signature_delta", "signature": signature}
                out = _event("content_block_delta", {"index": index, "delta": delta})
            return out + _event("content_block_stop", {"index": index})
        if isinstance(event, stream.MessageDelta):
            self._usage = event.usage or self._usage
            delta = {
                "stop_reason": render_stop(event.stop_reason),
                "stop_sequence": event.stop_sequence,
            }
            return _event("message_delta", {"delta": delta, "usage": render_usage(self._usage)})
        if isinstance(event, stream.MessageStop):
            return _event("message_stop", {})
        if isinstance(event, stream.StreamError):
            return render_stream_error(event.error)
        return self._delta(event)

    def _block_start(self, event: stream.BlockStart) -> bytes:
        index = len(self._indexes)
        self._indexes[event.index] = index
        block = event.block
        follow: dict[str, Any] | None = None
        if isinstance(block, internal.Text | internal.Refusal):
            shell: dict[str, Any] = {"type": "text", "text": ""}
            follow = {"type": "text_delta", "text": block.text} if block.text else None
        elif isinstance(block, internal.ToolCall):
            shell = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
            if block.arguments:
                follow = {"type": "input_json_delta", "partial_json": block.arguments}
        elif isinstance(block, internal.Thinking):
            shell = {"type": "thinking", "thinking": "", "signature": ""}
            if block.origin not in (None, NAME):
                self._foreign[event.index] = internal.Thinking(
                    "", None, block.item_id, block.origin
                )
            follow = {"type": "thinking_delta", "thinking": block.text} if block.text else None
        elif isinstance(block, internal.RedactedThinking):
            shell = {"type": "redacted_thinking", "data": block.data}
        else:
            shell = raw_output(block, NAME)
        out = _event("content_block_start", {"index": index, "content_block": shell})
        if follow is not None:
            out += _event("content_block_delta", {"index": index, "delta": follow})
        return out

    def _delta(self, event: stream.BlockDelta) -> bytes:
        if isinstance(event, stream.TextDelta):
            delta: dict[str, Any] = {"type": "text_delta", "text": event.text}
        elif isinstance(event, stream.ArgumentsDelta):
            delta = {"type": "input_json_delta", "partial_json": event.json}
        elif isinstance(event, stream.ThinkingDelta):
            delta = {"type": "thinking_delta", "thinking": event.text}
        elif isinstance(event, stream.SignatureDelta):
            if event.index in self._foreign:
                foreign = self._foreign[event.index]
                foreign.signature = (foreign.signature or "") + event.signature
                return b""
            delta = {"type": "signature_delta", "signature": event.signature}
        else:
            delta = event.data
        return _event("content_block_delta", {"index": self._indexes[event.index], "delta": delta})


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return encode_sse(orjson.dumps({"type": kind, **payload}), kind)
