"""Responses API streams from upstreams: semantic SSE events into internal events.

Each output_text or refusal content part is one text block, each ``function_call`` item one
tool-call block, each ``reasoning`` item one thinking block (its summary parts joined by blank
lines, its ``encrypted_content`` as the signature). Text an upstream sends only in a ``.done``
event (no deltas) is emitted as one delta, so nothing is lost. ``response.completed`` or
``response.incomplete`` end the stream with the usage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.formats import internal, stream
from gateway.formats.errors import ErrorInfo, UpstreamProtocolError
from gateway.formats.openai_responses.response import parse_reasoning, parse_stop, parse_usage
from gateway.formats.stream_parser import BaseStreamParser

NAME = "openai_responses"


class StreamParser(BaseStreamParser):
    """Feed each SSE ``data`` payload; ``close()`` when the upstream's stream ends."""

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._next_block = 0
        self._items: dict[int, tuple[str, int | None]] = {}  # output_index -> (type, block)
        self._parts: dict[tuple[int, int], int] = {}  # (output_index, content_index) -> block
        self._open: int | None = None
        self._sent: dict[int, str] = {}  # block -> the text or JSON streamed so far
        self._blocks: list[internal.Block] = []

    def _event(self, event: Any) -> list[stream.StreamEvent]:
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise UpstreamProtocolError("upstream sent a stream event without a type")
        kind: str = event["type"]
        handler = self._handlers().get(kind)
        if handler is not None:
            return handler(event)
        output_index = event.get("output_index")
        if isinstance(output_index, int) and self._items.get(output_index, ("",))[0] == "raw":
            return [stream.RawDelta(self._items[output_index][1], event)]  # type: ignore[arg-type]
        return []  # in_progress, queued, annotations, text .done events (handled at part end)

    def _handlers(self) -> dict[str, Callable[[dict[str, Any]], list[stream.StreamEvent]]]:
        return {
            "response.created": self._start,
            "response.completed": self._finish,
            "response.incomplete": self._finish,
            "response.failed": self._failed,
            "error": self._failed,
            "response.output_item.added": self._item_added,
            "response.output_item.done": self._item_done,
            "response.content_part.added": self._part_added,
            "response.content_part.done": self._part_done,
            "response.output_text.delta": self._part_delta,
            "response.refusal.delta": self._part_delta,
            "response.function_call_arguments.delta": lambda event: self._text(
                self._item_block(event), event.get("delta"), stream.ArgumentsDelta
            ),
            "response.function_call_arguments.done": lambda event: self._rest(
                self._item_block(event), event.get("arguments"), stream.ArgumentsDelta
            ),
            "response.reasoning_summary_text.delta": self._thinking_delta,
            "response.reasoning_text.delta": self._thinking_delta,
            "response.reasoning_summary_part.added": self._summary_part,
        }

    def _failed(self, event: dict[str, Any]) -> list[stream.StreamEvent]:
        self._finished = True
        return [stream.StreamError(_error_info(event))]

    def _part_done(self, event: dict[str, Any]) -> list[stream.StreamEvent]:
        block = self._parts.get((event.get("output_index"), event.get("content_index")))  # type: ignore[arg-type]
        part = event.get("part") or {}
        text = part.get("text", part.get("refusal")) if isinstance(part, dict) else None
        return self._close(block, text)

    def _part_delta(self, event: dict[str, Any]) -> list[stream.StreamEvent]:
        key = (event.get("output_index"), event.get("content_index"))
        events: list[stream.StreamEvent] = []
        if key not in self._parts:  # a provider that skips content_part.added
            part_type = (
                "output_text" if event["type"] == "response.output_text.delta" else "refusal"
            )
            events = self._part_added({**event, "part": {"type": part_type}})
        block = self._parts.get(key)  # type: ignore[arg-type]
        return events + self._text(block, event.get("delta"), stream.TextDelta)

    def _thinking_delta(self, event: dict[str, Any]) -> list[stream.StreamEvent]:
        return self._text(self._item_block(event), event.get("delta"), stream.ThinkingDelta)

    def _summary_part(self, event: dict[str, Any]) -> list[stream.StreamEvent]:
        """Summary parts after the first are joined to it by a blank line."""
        block = self._item_block(event)
        if event.get("summary_index", 0) and block is not None and self._sent.get(block):
            return self._text(block, "\n\n", stream.ThinkingDelta)
        return []

    def _start(self, event: dict[str, Any]) -> list[stream.StreamEvent]:
        if self._started:
            return []
        self._started = True
        response = event.get("response") or {}
        created = response.get("created_at")
        return [
            stream.MessageStart(
                id=str(response.get("id") or ""),
                model=str(response.get("model") or ""),
                created=int(created) if isinstance(created, int | float) else None,
            )
        ]

    def _new_block(self, block: internal.Block) -> tuple[int, list[stream.StreamEvent]]:
        events = self._close(self._open, None)
        index = self._next_block
        self._next_block += 1
        self._open = index
        self._sent[index] = ""
        self._blocks.append(block)
        events.append(stream.BlockStart(index, block))  # type: ignore[arg-type]
        return index, events

    def _item_added(self, event: dict[str, Any]) -> list[stream.StreamEvent]:
        item = event.get("item")
        output_index = event.get("output_index")
        if not isinstance(item, dict) or not isinstance(output_index, int):
            raise UpstreamProtocolError("upstream output_item.added has no item")
        kind = item.get("type")
        if kind == "message":
            self._items[output_index] = ("message", None)
            return []
        if kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise UpstreamProtocolError("upstream function_call has no call_id or name")
            index, events = self._new_block(internal.ToolCall(call_id, name, ""))
            self._items[output_index] = ("function_call", index)
            return events + self._text(index, item.get("arguments"), stream.ArgumentsDelta)
        if kind == "reasoning":
            index, events = self._new_block(
                internal.Thinking("", item_id=str(item.get("id") or ""), origin=NAME)
            )
            self._items[output_index] = ("reasoning", index)
            return events
        index, events = self._new_block(internal.Raw(NAME, item))
        self._items[output_index] = ("raw", index)
        return events

    def _item_done(self, event: dict[str, Any]) -> list[stream.StreamEvent]:
        item = event.get("item") if isinstance(event.get("item"), dict) else {}
        kind, block = self._items.get(event.get("output_index"), ("", None))  # type: ignore[arg-type]
        if kind == "function_call":
            events = self._rest(block, item.get("arguments"), stream.ArgumentsDelta)
            return events + self._close(block, None)
        if kind == "reasoning":
            thinking = parse_reasoning(item)
            events = self._rest(block, thinking.text, stream.ThinkingDelta)
            if thinking.signature:
                events.append(stream.SignatureDelta(block, thinking.signature))  # type: ignore[arg-type]
            return events + self._close(block, None)
        if kind == "raw":
            return self._close(block, None)
        return []

    def _part_added(self, event: dict[str, Any]) -> list[stream.StreamEvent]:
        part = event.get("part")
        key = (event.get("output_index"), event.get("content_index"))
        if not isinstance(part, dict) or part.get("type") not in ("output_text", "refusal"):
            return []
        shell: internal.Block = (
            internal.Text("") if part["type"] == "output_text" else internal.Refusal("")
        )
        index, events = self._new_block(shell)
        self._parts[key] = index  # type: ignore[index]
        return events + self._text(index, part.get("text") or part.get("refusal"), stream.TextDelta)

    def _item_block(self, event: dict[str, Any]) -> int | None:
        return self._items.get(event.get("output_index"), ("", None))[1]  # type: ignore[arg-type]

    def _text(self, block: int | None, value: Any, kind: type) -> list[stream.StreamEvent]:
        if block is None or not isinstance(value, str) or not value:
            return []
        if block != self._open:
            raise UpstreamProtocolError("interleaved output items cannot be translated")
        self._sent[block] += value
        return [kind(block, value)]

    def _rest(self, block: int | None, full: Any, kind: type) -> list[stream.StreamEvent]:
        """What a ``.done`` event holds beyond the deltas already sent (all of it, if none)."""
        if block is None or not isinstance(full, str):
            return []
        sent = self._sent.get(block, "")
        if full.startswith(sent) and len(full) > len(sent):
            return self._text(block, full[len(sent) :], kind)
        return []

    def _close(self, block: int | None, full_text: Any) -> list[stream.StreamEvent]:
        if block is None or block != self._open:
            return []
        events = self._rest(block, full_text, stream.TextDelta)
        self._open = None
        return [*events, stream.BlockStop(block)]

    def _finish(self, event: dict[str, Any]) -> list[stream.StreamEvent]:
        self._finished = True
        response = event.get("response") or {}
        events = self._close(self._open, None)
        usage = response.get("usage")
        if isinstance(usage, dict):
            self.usage = parse_usage(usage)
        stop: internal.StopReason = parse_stop(response, self._blocks)
        return [*events, stream.MessageDelta(stop, self.usage), stream.MessageStop()]


def _error_info(event: dict[str, Any]) -> ErrorInfo:
    error = event
    if event.get("type") == "response.failed":
        response = event.get("response") or {}
        error = response.get("error") if isinstance(response.get("error"), dict) else {}
    code = error.get("code") if isinstance(error.get("code"), str) else None
    message = error.get("message") if isinstance(error.get("message"), str) else None
    status = 429 if code == "rate_limit_exceeded" else 500
    return ErrorInfo.for_status(status, message or "the upstream response failed", code=code)
