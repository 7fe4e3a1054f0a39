"""Responses API streams for clients: internal events into the Responses API's SSE events.

Every event carries a rising ``sequence_number``; ``response.created`` and
``response.in_progress`` open, each block becomes an output item (``output_item.added`` ...
``output_item.done``) with the content-part and summary-part events the SDK's accumulator
expects, and ``response.completed`` (or ``.incomplete``) closes with the whole response. A
stream error becomes an ``error`` event followed by ``response.failed``.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.formats import internal, stream
from gateway.formats.errors import ErrorInfo
from gateway.formats.openai_errors import render_error
from gateway.formats.openai_responses.response import (
    ResponseObject,
    item_id,
    message_item,
    output_item,
    response_object,
    status_of,
)
from gateway.formats.portability import raw_output
from gateway.formats.signatures import for_client
from gateway.formats.sse import encode_sse

NAME = "openai_responses"


class StreamRenderer:
    """Renders internal stream events as Responses API SSE bytes for one client."""

    def __init__(self, request: internal.ChatRequest | None = None) -> None:
        self._request = request
        self._sequence = 0
        self._id = ""
        self._model = ""
        self._created = 0
        self._output: list[dict[str, Any]] = []  # the items so far, as the final response shows
        self._slots: dict[int, int] = {}  # internal block index -> output index
        self._blocks: dict[int, internal.Block] = {}
        self._summary_open: set[int] = set()
        self._signatures: dict[int, internal.Thinking] = {}  # reasoning proofs gathered per block
        self._stop: internal.StopReason | None = None
        self._usage: internal.Usage | None = None

    def render(self, event: stream.StreamEvent) -> bytes:
        if isinstance(event, stream.MessageStart):
            self._id, self._model = event.id, event.model
            self._created = event.created if event.created is not None else int(time.time())
            self._usage = event.usage
            snapshot = self._response("in_progress")
            return self._emit("response.created", response=snapshot) + self._emit(
                "response.in_progress", response=snapshot
            )
        if isinstance(event, stream.BlockStart):
            return self._start(event.index, event.block)
        if isinstance(event, stream.BlockStop):
            return self._stop_block(event.index)
        if isinstance(event, stream.MessageDelta):
            self._stop = event.stop_reason
            self._usage = event.usage or self._usage
            return b""
        if isinstance(event, stream.MessageStop):
            status, incomplete = status_of(self._stop)
            response = self._response(status, incomplete)
            return self._emit(f"response.{status}", response=response)
        if isinstance(event, stream.StreamError):
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
    ) -> ResponseObject:
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

    def _start(self, index: int, block: internal.Block) -> bytes:
        self._blocks[index] = block
        if isinstance(block, internal.RedactedThinking):
            return b""  # no readable text, no item (documented)
        slot = len(self._output)
        self._slots[index] = slot
        if isinstance(block, internal.Text | internal.Refusal):
            item = message_item(item_id("msg", self._id, slot), [], "in_progress")
            part: dict[str, Any] = (
                {"type": "output_text", "text": "", "annotations": []}
                if isinstance(block, internal.Text)
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
                out += self._delta(stream.TextDelta(index, block.text))
            return out
        if isinstance(block, internal.ToolCall):
            item = output_item(
                internal.ToolCall(block.id, block.name, ""), self._id, slot, "in_progress"
            )
        elif isinstance(block, internal.Thinking):
            shell = internal.Thinking("", item_id=block.item_id, origin=block.origin)
            self._signatures[index] = shell
            item = output_item(shell, self._id, slot)
        else:
            item = dict(raw_output(block, NAME))  # type: ignore[arg-type]
        self._output.append(item)
        out = self._emit("response.output_item.added", output_index=slot, item=item)
        if isinstance(block, internal.ToolCall) and block.arguments:
            out += self._delta(stream.ArgumentsDelta(index, block.arguments))
        if isinstance(block, internal.Thinking) and block.text:
            out += self._delta(stream.ThinkingDelta(index, block.text))
        return out

    def _delta(self, event: stream.BlockDelta) -> bytes:
        if event.index not in self._slots:
            return b""  # a delta of a block with no item (redacted thinking)
        slot = self._slots[event.index]
        item = self._output[slot]
        if isinstance(event, stream.RawDelta):
            return self._emit(
                str(event.data.get("type")),
                **{k: v for k, v in event.data.items() if k not in ("type", "sequence_number")},
            )
        if isinstance(event, stream.TextDelta):
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
        if isinstance(event, stream.ArgumentsDelta):
            item["arguments"] += event.json
            return self._emit(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=slot,
                delta=event.json,
            )
        if isinstance(event, stream.SignatureDelta):
            shell = self._signatures[event.index]
            shell.signature = (shell.signature or "") + event.signature
            item["encrypted_content"] = for_client(shell, NAME)
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
        if isinstance(block, internal.Text | internal.Refusal):
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
        elif isinstance(block, internal.ToolCall):
            out += self._emit(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=slot,
                name=item["name"],
                arguments=item["arguments"],
            )
            item["status"] = "completed"
        elif isinstance(block, internal.Thinking) and index in self._summary_open:
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
