"""Chat Completions streams for clients: internal events into ``chat.completion.chunk`` SSE.

Reasoning goes as ``reasoning_content`` deltas; signatures have no place. The final usage chunk
(empty ``choices``) is sent only when ``request.include_usage`` asked for it, as OpenAI does:
clients that did not ask may not expect empty ``choices``. A failure is the gateway's SSE
``error`` event, never a clean ``[DONE]``.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.formats import internal, stream
from gateway.formats.openai_chat.response import completion_head, finish_reason, render_usage
from gateway.formats.openai_errors import render_stream_error
from gateway.formats.portability import raw_output
from gateway.formats.sse import encode_sse

NAME = "openai_chat"
DONE = b"data: [DONE]\n\n"


class StreamRenderer:
    """Renders internal stream events as Chat Completions SSE bytes for one client."""

    def __init__(self, request: internal.ChatRequest | None = None) -> None:
        self._include_usage = True if request is None else bool(request.include_usage)
        self._head: dict[str, Any] = {}  # set by MessageStart
        self._tools: dict[int, int] = {}  # block index -> the chunk's tool-call index
        self._refusals: set[int] = set()

    def render(self, event: stream.StreamEvent) -> bytes:
        if isinstance(event, stream.MessageStart):
            self._head = completion_head("chat.completion.chunk", event)
            return self._chunk({"role": "assistant", "content": ""})
        if isinstance(event, stream.BlockStart):
            return self._start(event)
        if isinstance(event, stream.TextDelta):
            key = "refusal" if event.index in self._refusals else "content"
            return self._chunk({key: event.text})
        if isinstance(event, stream.ArgumentsDelta):
            call = {"index": self._tools[event.index], "function": {"arguments": event.json}}
            return self._chunk({"tool_calls": [call]})
        if isinstance(event, stream.ThinkingDelta):
            return self._chunk({"reasoning_content": event.text})
        if isinstance(event, stream.MessageDelta):
            out = self._chunk({}, finish_reason(event.stop_reason))
            if self._include_usage and event.usage is not None:
                out += self._event(
                    {**self._head, "choices": [], "usage": render_usage(event.usage)}
                )
            return out
        if isinstance(event, stream.MessageStop):
            return DONE
        if isinstance(event, stream.StreamError):
            return render_stream_error(event.error)
        assert isinstance(event, stream.SignatureDelta | stream.RawDelta | stream.BlockStop)
        return b""  # no place for signatures here; blocks end implicitly

    def _start(self, event: stream.BlockStart) -> bytes:
        block = event.block
        if isinstance(block, internal.ToolCall):
            position = len(self._tools)
            self._tools[event.index] = position
            call = {
                "index": position,
                "id": block.id,
                "type": "function",
                "function": {"name": block.name, "arguments": block.arguments},
            }
            return self._chunk({"tool_calls": [call]})
        if isinstance(block, internal.Raw):
            raw_output(block, NAME)  # raises: no other format's raw content fits a chunk
            return b""
        if isinstance(block, internal.Refusal):
            self._refusals.add(event.index)
            return self._chunk({"refusal": block.text}) if block.text else b""
        if isinstance(block, internal.Text) and block.text:
            return self._chunk({"content": block.text})
        if isinstance(block, internal.Thinking) and block.text:
            return self._chunk({"reasoning_content": block.text})
        return b""

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return self._event({**self._head, "choices": [choice]})

    @staticmethod
    def _event(payload: dict[str, Any]) -> bytes:
        return encode_sse(orjson.dumps(payload))
