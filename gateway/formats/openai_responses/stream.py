"""Responses API streams: semantic SSE events into internal stream events, and back.

Parsing: each output_text or refusal content part is one text block, each ``function_call``
item one tool-call block, each ``reasoning`` item one thinking block (its summary parts joined
by blank lines, its ``encrypted_content`` as the signature). Text an upstream sends only in a
``.done`` event (no deltas) is emitted as one delta, so nothing is lost. ``response.completed``
or ``response.incomplete`` end the stream with the usage.

Rendering: every event carries a rising ``sequence_number``; ``response.created`` and
``response.in_progress`` open, each block becomes an output item (``output_item.added`` ...
``output_item.done``) with the content-part and summary-part events the SDK's accumulator
expects, and ``response.completed`` (or ``.incomplete``) closes with the whole response. A
stream error becomes an ``error`` event followed by ``response.failed``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway.formats.errors import ErrorInfo, UpstreamProtocolError
from gateway.formats.internal import (
    Block,
    ChatRequest,
    Raw,
    RedactedThinking,
    Refusal,
    StopReason,
    Text,
    Thinking,
    ToolCall,
    Usage,
)
from gateway.formats.openai_errors import render_error
from gateway.formats.openai_responses.response import (
    item_id,
    message_item,
    output_item,
    parse_reasoning,
    parse_stop,
    parse_usage,
    response_object,
    status_of,
)
from gateway.formats.portability import raw_output
from gateway.formats.sse import encode_sse
from gateway.formats.stream import (
    ArgumentsDelta,
    BlockStart,
    BlockStop,
    MessageDelta,
    MessageStart,
    MessageStop,
    RawDelta,
    SignatureDelta,
    StreamError,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
)

NAME = "openai_responses"


class StreamParser:
    """Feed each SSE ``data`` payload; ``close()`` when the upstream's stream ends."""

    def __init__(self) -> None:
        self._started = False
        self._finished = False
        self._next_block = 0
        self._items: dict[int, tuple[str, int | None]] = {}  # output_index -> (type, block)
        self._parts: dict[tuple[int, int], int] = {}  # (output_index, content_index) -> block
        self._open: int | None = None
        self._sent: dict[int, str] = {}  # block -> the text or JSON streamed so far
        self._blocks: list[Block] = []
        self.usage: Usage | None = None

    def feed(self, data: bytes | str) -> list[StreamEvent]:
        if self._finished:
            return []
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise UpstreamProtocolError("upstream sent a stream event that is not JSON") from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise UpstreamProtocolError("upstream sent a stream event without a type")
        kind: str = event["type"]
        handler = self._handlers().get(kind)
        if handler is not None:
            return handler(event)
        output_index = event.get("output_index")
        if isinstance(output_index, int) and self._items.get(output_index, ("",))[0] == "raw":
            return [RawDelta(self._items[output_index][1], event)]  # type: ignore[arg-type]
        return []  # in_progress, queued, annotations, text .done events (handled at part end)

    def _handlers(self) -> dict[str, Callable[[dict[str, Any]], list[StreamEvent]]]:
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
                self._item_block(event), event.get("delta"), ArgumentsDelta
            ),
            "response.function_call_arguments.done": lambda event: self._rest(
                self._item_block(event), event.get("arguments"), ArgumentsDelta
            ),
            "response.reasoning_summary_text.delta": self._thinking_delta,
            "response.reasoning_text.delta": self._thinking_delta,
            "response.reasoning_summary_part.added": self._summary_part,
        }

    def _failed(self, event: dict[str, Any]) -> list[StreamEvent]:
        self._finished = True
        return [StreamError(_error_info(event))]

    def _part_done(self, event: dict[str, Any]) -> list[StreamEvent]:
        block = self._parts.get((event.get("output_index"), event.get("content_index")))  # type: ignore[arg-type]
        part = event.get("part") or {}
        text = part.get("text", part.get("refusal")) if isinstance(part, dict) else None
        return self._close(block, text)

    def _part_delta(self, event: dict[str, Any]) -> list[StreamEvent]:
        key = (event.get("output_index"), event.get("content_index"))
        events: list[StreamEvent] = []
        if key not in self._parts:  # a provider that skips content_part.added
            part_type = (
                "output_text" if event["type"] == "response.output_text.delta" else "refusal"
            )
            events = self._part_added({**event, "part": {"type": part_type}})
        block = self._parts.get(key)  # type: ignore[arg-type]
        return events + self._text(block, event.get("delta"), TextDelta)

    def _thinking_delta(self, event: dict[str, Any]) -> list[StreamEvent]:
        return self._text(self._item_block(event), event.get("delta"), ThinkingDelta)

    def _summary_part(self, event: dict[str, Any]) -> list[StreamEvent]:
        """Summary parts after the first are joined to it by a blank line."""
        block = self._item_block(event)
        if event.get("summary_index", 0) and block is not None and self._sent.get(block):
            return self._text(block, "\n\n", ThinkingDelta)
        return []

    def close(self) -> list[StreamEvent]:
        if self._finished:
            return []
        self._finished = True
        return [StreamError(ErrorInfo(502, "the upstream stream ended early", "api_error"))]

    def _start(self, event: dict[str, Any]) -> list[StreamEvent]:
        if self._started:
            return []
        self._started = True
        response = event.get("response") or {}
        created = response.get("created_at")
        return [
            MessageStart(
                id=str(response.get("id") or ""),
                model=str(response.get("model") or ""),
                created=int(created) if isinstance(created, int | float) else None,
            )
        ]

    def _new_block(self, block: Block) -> tuple[int, list[StreamEvent]]:
        events = self._close(self._open, None)
        index = self._next_block
        self._next_block += 1
        self._open = index
        self._sent[index] = ""
        self._blocks.append(block)
        events.append(BlockStart(index, block))  # type: ignore[arg-type]
        return index, events

    def _item_added(self, event: dict[str, Any]) -> list[StreamEvent]:
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
            index, events = self._new_block(ToolCall(call_id, name, ""))
            self._items[output_index] = ("function_call", index)
            return events + self._text(index, item.get("arguments"), ArgumentsDelta)
        if kind == "reasoning":
            index, events = self._new_block(Thinking("", item_id=str(item.get("id") or "")))
            self._items[output_index] = ("reasoning", index)
            return events
        index, events = self._new_block(Raw(NAME, item))
        self._items[output_index] = ("raw", index)
        return events

    def _item_done(self, event: dict[str, Any]) -> list[StreamEvent]:
        item = event.get("item") if isinstance(event.get("item"), dict) else {}
        kind, block = self._items.get(event.get("output_index"), ("", None))  # type: ignore[arg-type]
        if kind == "function_call":
            events = self._rest(block, item.get("arguments"), ArgumentsDelta)
            return events + self._close(block, None)
        if kind == "reasoning":
            thinking = parse_reasoning(item)
            events = self._rest(block, thinking.text, ThinkingDelta)
            if thinking.signature:
                events.append(SignatureDelta(block, thinking.signature))  # type: ignore[arg-type]
            return events + self._close(block, None)
        if kind == "raw":
            return self._close(block, None)
        return []

    def _part_added(self, event: dict[str, Any]) -> list[StreamEvent]:
        part = event.get("part")
        key = (event.get("output_index"), event.get("content_index"))
        if not isinstance(part, dict) or part.get("type") not in ("output_text", "refusal"):
            return []
        shell: Block = Text("") if part["type"] == "output_text" else Refusal("")
        index, events = self._new_block(shell)
        self._parts[key] = index  # type: ignore[index]
        return events + self._text(index, part.get("text") or part.get("refusal"), TextDelta)

    def _item_block(self, event: dict[str, Any]) -> int | None:
        return self._items.get(event.get("output_index"), ("", None))[1]  # type: ignore[arg-type]

    def _text(self, block: int | None, value: Any, kind: type) -> list[StreamEvent]:
        if block is None or not isinstance(value, str) or not value:
            return []
        if block != self._open:
            raise UpstreamProtocolError("interleaved output items cannot be translated")
        self._sent[block] += value
        return [kind(block, value)]

    def _rest(self, block: int | None, full: Any, kind: type) -> list[StreamEvent]:
        """What a ``.done`` event holds beyond the deltas already sent (all of it, if none)."""
        if block is None or not isinstance(full, str):
            return []
        sent = self._sent.get(block, "")
        if full.startswith(sent) and len(full) > len(sent):
            return self._text(block, full[len(sent) :], kind)
        return []

    def _close(self, block: int | None, full_text: Any) -> list[StreamEvent]:
        if block is None or block != self._open:
            return []
        events = self._rest(block, full_text, TextDelta)
        self._open = None
        return [*events, BlockStop(block)]

    def _finish(self, event: dict[str, Any]) -> list[StreamEvent]:
        self._finished = True
        response = event.get("response") or {}
        events = self._close(self._open, None)
        usage = response.get("usage")
        if isinstance(usage, dict):
            self.usage = parse_usage(usage)
        stop: StopReason = parse_stop(response, self._blocks)
        return [*events, MessageDelta(stop, self.usage), MessageStop()]


def _error_info(event: dict[str, Any]) -> ErrorInfo:
    error = event
    if event.get("type") == "response.failed":
        response = event.get("response") or {}
        error = response.get("error") if isinstance(response.get("error"), dict) else {}
    code = error.get("code") if isinstance(error.get("code"), str) else None
    message = error.get("message") if isinstance(error.get("message"), str) else None
    status = 429 if code == "rate_limit_exceeded" else 500
    return ErrorInfo.for_status(status, message or "the upstream response failed", code=code)


class StreamRenderer:
    """Renders internal stream events as Responses API SSE bytes for one client."""

    def __init__(self, request: ChatRequest | None = None) -> None:
        self._request = request
        self._sequence = 0
        self._id = ""
        self._model = ""
        self._created = 0
        self._output: list[dict[str, Any]] = []  # the items so far, as the final response shows
        self._slots: dict[int, int] = {}  # internal block index -> output index
        self._blocks: dict[int, Block] = {}
        self._summary_open: set[int] = set()
        self._stop: StopReason | None = None
        self._usage: Usage | None = None

    def render(self, event: StreamEvent) -> bytes:
        if isinstance(event, MessageStart):
            self._id, self._model = event.id, event.model
            self._created = event.created if event.created is not None else int(time.time())
            self._usage = event.usage
            snapshot = self._response("in_progress")
            return self._emit("response.created", response=snapshot) + self._emit(
                "response.in_progress", response=snapshot
            )
        if isinstance(event, BlockStart):
            return self._start(event.index, event.block)
        if isinstance(event, BlockStop):
            return self._stop_block(event.index)
        if isinstance(event, MessageDelta):
            self._stop = event.stop_reason
            self._usage = event.usage or self._usage
            return b""
        if isinstance(event, MessageStop):
            status, incomplete = status_of(self._stop)
            response = self._response(status, incomplete)
            return self._emit(f"response.{status}", response=response)
        if isinstance(event, StreamError):
            return self._error(event.error)
        return self._delta(event)

    def _emit(self, kind: str, **fields: Any) -> bytes:
        """One event, serialized at once: later changes to the items it holds do not leak in."""
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return encode_sse(orjson.dumps(payload), kind)

    def _response(
        self,
        status: str,
        incomplete: dict[str, str] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return response_object(
            self._id,
            self._model,
            self._created,
            self._request,
            status=status,
            output=self._output,
            usage=self._usage if status != "in_progress" else None,
            incomplete=incomplete,
            error=error,
        )

    def _start(self, index: int, block: Block) -> bytes:
        self._blocks[index] = block
        if isinstance(block, RedactedThinking):
            return b""  # no readable text, no item (documented)
        slot = len(self._output)
        self._slots[index] = slot
        if isinstance(block, Text | Refusal):
            item = message_item(item_id("msg", self._id, slot), [], "in_progress")
            part: dict[str, Any] = (
                {"type": "output_text", "text": "", "annotations": []}
                if isinstance(block, Text)
                else {"type": "refusal", "refusal": ""}
            )
            self._output.append(item)
            out = self._emit("response.output_item.added", output_index=slot, item=item)
            item["content"] = [part]
            out += self._emit(
                "response.content_part.added",
                item_id=item["id"],
                output_index=slot,
                content_index=0,
                part=part,
            )
            if block.text:
                out += self._delta(TextDelta(index, block.text))
            return out
        if isinstance(block, ToolCall):
            item = output_item(ToolCall(block.id, block.name, ""), self._id, slot, "in_progress")
        elif isinstance(block, Thinking):
            item = output_item(Thinking("", item_id=block.item_id), self._id, slot)
        else:
            item = dict(raw_output(block, NAME))  # type: ignore[arg-type]
        self._output.append(item)
        out = self._emit("response.output_item.added", output_index=slot, item=item)
        if isinstance(block, ToolCall) and block.arguments:
            out += self._delta(ArgumentsDelta(index, block.arguments))
        if isinstance(block, Thinking) and block.text:
            out += self._delta(ThinkingDelta(index, block.text))
        return out

    def _delta(
        self, event: TextDelta | ArgumentsDelta | ThinkingDelta | SignatureDelta | RawDelta
    ) -> bytes:
        if event.index not in self._slots:
            return b""  # a delta of a block with no item (redacted thinking)
        slot = self._slots[event.index]
        item = self._output[slot]
        if isinstance(event, RawDelta):
            return self._emit(
                str(event.data.get("type")),
                **{k: v for k, v in event.data.items() if k not in ("type", "sequence_number")},
            )
        if isinstance(event, TextDelta):
            part = item["content"][0]
            if part["type"] == "refusal":
                part["refusal"] += event.text
                kind = "response.refusal.delta"
                return self._emit(
                    kind, item_id=item["id"], output_index=slot, content_index=0, delta=event.text
                )
            part["text"] += event.text
            return self._emit(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=slot,
                content_index=0,
                delta=event.text,
                logprobs=[],
            )
        if isinstance(event, ArgumentsDelta):
            item["arguments"] += event.json
            return self._emit(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=slot,
                delta=event.json,
            )
        if isinstance(event, SignatureDelta):
            item["encrypted_content"] = item.get("encrypted_content", "") + event.signature
            return b""
        out = b""
        if event.index not in self._summary_open:
            self._summary_open.add(event.index)
            item["summary"] = [{"type": "summary_text", "text": ""}]
            out += self._emit(
                "response.reasoning_summary_part.added",
                item_id=item["id"],
                output_index=slot,
                summary_index=0,
                part={"type": "summary_text", "text": ""},
            )
        item["summary"][0]["text"] += event.text
        return out + self._emit(
            "response.reasoning_summary_text.delta",
            item_id=item["id"],
            output_index=slot,
            summary_index=0,
            delta=event.text,
        )

    def _stop_block(self, index: int) -> bytes:
        if index not in self._slots:
            return b""
        slot = self._slots[index]
        item = self._output[slot]
        block = self._blocks[index]
        out = b""
        if isinstance(block, Text | Refusal):
            part = item["content"][0]
            common = {"item_id": item["id"], "output_index": slot, "content_index": 0}
            if part["type"] == "output_text":
                out += self._emit(
                    "response.output_text.done", **common, text=part["text"], logprobs=[]
                )
            else:
                out += self._emit("response.refusal.done", **common, refusal=part["refusal"])
            out += self._emit("response.content_part.done", **common, part=part)
            item["status"] = "completed"
        elif isinstance(block, ToolCall):
            out += self._emit(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=slot,
                name=item["name"],
                arguments=item["arguments"],
            )
            item["status"] = "completed"
        elif isinstance(block, Thinking) and index in self._summary_open:
            summary = item["summary"][0]
            common = {"item_id": item["id"], "output_index": slot, "summary_index": 0}
            out += self._emit(
                "response.reasoning_summary_text.done", **common, text=summary["text"]
            )
            out += self._emit("response.reasoning_summary_part.done", **common, part=summary)
        return out + self._emit("response.output_item.done", output_index=slot, item=item)

    def _error(self, error: ErrorInfo) -> bytes:
        envelope = render_error(error)["error"]
        out = self._emit("error", code=envelope["code"], message=error.message, param=error.param)
        code = "rate_limit_exceeded" if error.kind == "rate_limit" else "server_error"
        failed = self._response("failed", error={"code": code, "message": error.message})
        return out + self._emit("response.failed", response=failed)


def render_stream_error(info: ErrorInfo) -> bytes:
    """An ``error`` event for a stream that failed before any renderer state existed."""
    envelope = render_error(info)["error"]
    payload = {
        "type": "error",
        "sequence_number": 0,
        "code": envelope["code"],
        "message": info.message,
        "param": info.param,
    }
    return encode_sse(orjson.dumps(payload), "error")
