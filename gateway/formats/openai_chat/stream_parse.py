"""Chat Completions streams from upstreams: ``chat.completion.chunk`` events into internal events.

One block opens per kind of delta (reasoning, text, refusal, each tool call) and closes when
another kind starts, so the internal stream never has two blocks open. The stop reason arrives
before the usage chunk, so ``MessageDelta`` is emitted at ``[DONE]`` (or at the end of the
upstream's stream) with both. Azure's leading ``prompt_filter_results`` chunk is skipped.
"""

from __future__ import annotations

from typing import Any, Literal

from gateway.formats import internal, stream
from gateway.formats.errors import ErrorInfo, UpstreamProtocolError
from gateway.formats.openai_chat.response import FINISH_TO_STOP, parse_usage, reasoning_text
from gateway.formats.openai_errors import parse_error
from gateway.formats.stream_parser import BaseStreamParser

_Kind = Literal["thinking", "text", "refusal", "tool"]


class StreamParser(BaseStreamParser):
    """Feed each SSE ``data`` payload; ``close()`` when the upstream's stream ends."""

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._id = ""
        self._open: tuple[_Kind, int] | None = None  # (kind, tool index) of the open block
        self._next_block = 0
        self._tool_blocks: dict[int, int] = {}  # the chunk's tool-call index -> block index
        self._stop: internal.StopReason | None = None

    def feed(self, data: bytes | str) -> list[stream.StreamEvent]:
        if not self._finished and data.strip() in (b"[DONE]", "[DONE]"):
            return self._finish()
        return super().feed(data)

    def _event(self, chunk: Any) -> list[stream.StreamEvent]:
        if not isinstance(chunk, dict):
            raise UpstreamProtocolError("upstream sent a stream event that is not an object")
        if "error" in chunk:
            self._finished = True
            return [stream.StreamError(parse_error(None, chunk))]
        events: list[stream.StreamEvent] = []
        if not chunk.get("choices") and not isinstance(chunk.get("usage"), dict):
            return events  # Azure's leading prompt_filter_results chunk: no id, no model
        if not self._started:
            self._started = True
            self._id = str(chunk.get("id") or "")
            created = chunk.get("created")
            events.append(
                stream.MessageStart(
                    id=self._id,
                    model=str(chunk.get("model") or ""),
                    created=created if isinstance(created, int) else None,
                )
            )
        if isinstance(chunk.get("usage"), dict):
            self.usage = parse_usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                raise UpstreamProtocolError("a stream with several choices cannot be translated")
            self._choice(choice, events)
        return events

    def close(self) -> list[stream.StreamEvent]:
        """The upstream's stream ended: finish if it had finished, else report it cut short."""
        if not self._finished and self._stop is not None:
            return self._finish()
        return super().close()

    def _choice(self, choice: dict[str, Any], events: list[stream.StreamEvent]) -> None:
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise UpstreamProtocolError("upstream stream delta is not an object")
        thinking = reasoning_text(delta)
        if thinking:
            self._switch("thinking", 0, events)
            events.append(stream.ThinkingDelta(self._next_block - 1, thinking))
        content = delta.get("content")
        if isinstance(content, str) and content:
            self._switch("text", 0, events)
            events.append(stream.TextDelta(self._next_block - 1, content))
        refusal = delta.get("refusal")
        if isinstance(refusal, str) and refusal:
            self._switch("refusal", 0, events)
            events.append(stream.TextDelta(self._next_block - 1, refusal))
        for call in delta.get("tool_calls") or []:
            self._tool_delta(call, events)
        reason = choice.get("finish_reason")
        if reason:
            self._close_open(events)
            self._stop = FINISH_TO_STOP.get(reason, "end_turn")

    def _tool_delta(self, call: Any, events: list[stream.StreamEvent]) -> None:
        if not isinstance(call, dict):
            raise UpstreamProtocolError("upstream tool-call delta is not an object")
        position = call.get("index", 0)
        function = call.get("function") or {}
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if position not in self._tool_blocks:
            name = function.get("name") if isinstance(function, dict) else None
            if not isinstance(name, str) or not name:
                raise UpstreamProtocolError("upstream tool call started without a name")
            self._close_open(events)
            call_id = call.get("id") or f"call_{self._id}_{position}"
            block = self._next_block
            self._next_block += 1
            self._tool_blocks[position] = block
            self._open = ("tool", position)
            events.append(stream.BlockStart(block, internal.ToolCall(str(call_id), name, "")))
        elif self._open != ("tool", position):
            raise UpstreamProtocolError("interleaved tool-call deltas cannot be translated")
        if isinstance(arguments, str) and arguments:
            events.append(stream.ArgumentsDelta(self._tool_blocks[position], arguments))

    def _switch(self, kind: _Kind, position: int, events: list[stream.StreamEvent]) -> None:
        if self._open == (kind, position):
            return
        self._close_open(events)
        shell = {
            "thinking": internal.Thinking(""),
            "text": internal.Text(""),
            "refusal": internal.Refusal(""),
        }[kind]
        events.append(stream.BlockStart(self._next_block, shell))
        self._next_block += 1
        self._open = (kind, position)

    def _close_open(self, events: list[stream.StreamEvent]) -> None:
        if self._open is None:
            return
        kind, position = self._open
        index = self._tool_blocks[position] if kind == "tool" else self._next_block - 1
        events.append(stream.BlockStop(index))
        self._open = None

    def _finish(self) -> list[stream.StreamEvent]:
        self._finished = True
        if not self._started:
            return [
                stream.StreamError(ErrorInfo(502, "the upstream stream was empty", "api_error"))
            ]
        events: list[stream.StreamEvent] = []
        self._close_open(events)
        events.append(stream.MessageDelta(self._stop or "end_turn", self.usage))
        events.append(stream.MessageStop())
        return events
