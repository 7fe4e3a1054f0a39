"""Bedrock ``ConverseStream`` events into internal events.

The provider decodes the binary event stream and hands each event on as one JSON object named
by its event type, as the AWS SDKs show them: ``{"messageStart": {...}}``,
``{"contentBlockStart": {...}}``, ``{"contentBlockDelta": {...}}``, ``{"contentBlockStop":
{...}}``, ``{"messageStop": {...}}``, ``{"metadata": {...}}``, or an exception
(``{"throttlingException": {"message"}}``). Converse starts a block explicitly only for a tool
call: a text or reasoning block begins with its first delta. The usage comes in ``metadata``,
after ``messageStop``, so the stop and the usage go out together when it arrives.
"""

from __future__ import annotations

from typing import Any

from gateway.formats import stream
from gateway.formats.bedrock_converse.errors import EXCEPTIONS, parse_error
from gateway.formats.bedrock_converse.response import new_id, parse_stop, parse_usage
from gateway.formats.errors import UpstreamProtocolError
from gateway.formats.internal import StopReason, Text, Thinking, ToolCall
from gateway.formats.stream_parser import BaseStreamParser

NAME = "bedrock_converse"


class StreamParser(BaseStreamParser):
    """Feed each event as JSON; ``close()`` when the upstream's stream ends."""

    def __init__(self) -> None:
        super().__init__()
        self._open: int | None = None  # the Converse index of the open block
        self._kinds: dict[int, str] = {}  # Converse index -> the kind of block it started
        self._stop: StopReason | None = None
        self._stopped = False

    def _event(self, payload: Any) -> list[stream.StreamEvent]:
        if not isinstance(payload, dict) or len(payload) != 1:
            raise UpstreamProtocolError("upstream sent a ConverseStream event that is not one")
        ((kind, event),) = payload.items()
        if kind in EXCEPTIONS:
            self._finished = True
            return [stream.StreamError(parse_error(None, payload))]
        if not isinstance(event, dict):
            raise UpstreamProtocolError(f"upstream {kind} event is not an object")
        if kind == "messageStart":
            return [stream.MessageStart(id=new_id(), model="")]
        if kind == "contentBlockStart":
            return self._start(event)
        if kind == "contentBlockDelta":
            return self._delta(event)
        if kind == "contentBlockStop":
            index = self._index(event)
            if self._open != index:
                return []  # an empty block that never opened
            self._open = None
            return [stream.BlockStop(index)]
        if kind == "messageStop":
            self._stop, self._stopped = parse_stop(event.get("stopReason")), True
            return []
        if kind == "metadata":
            usage = event.get("usage")
            if isinstance(usage, dict):
                self.usage = parse_usage(usage)
            return self._end() if self._stopped else []
        return []  # event types newer than this parser

    def close(self) -> list[stream.StreamEvent]:
        if not self._finished and self._stopped:  # a stop without its metadata: no usage
            return self._end()
        return super().close()

    def _end(self) -> list[stream.StreamEvent]:
        self._finished = True
        events: list[stream.StreamEvent] = []
        if self._open is not None:
            events.append(stream.BlockStop(self._open))
            self._open = None
        return [*events, stream.MessageDelta(self._stop, self.usage), stream.MessageStop()]

    def _index(self, event: dict[str, Any]) -> int:
        index = event.get("contentBlockIndex")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise UpstreamProtocolError("upstream ConverseStream event has no contentBlockIndex")
        return index

    def _opening(self, index: int, kind: str, shell: Any) -> list[stream.StreamEvent]:
        if index in self._kinds:
            raise UpstreamProtocolError(f"upstream block {index} started twice")
        events: list[stream.StreamEvent] = []
        if self._open is not None:  # Converse closes each block; a missing stop is tolerated
            events.append(stream.BlockStop(self._open))
        self._kinds[index], self._open = kind, index
        events.append(stream.BlockStart(index, shell))
        return events

    def _start(self, event: dict[str, Any]) -> list[stream.StreamEvent]:
        index = self._index(event)
        start = event.get("start")
        use = start.get("toolUse") if isinstance(start, dict) else None
        if not isinstance(use, dict):
            return []  # a start of a kind this parser does not know: its deltas say more
        call_id, name = use.get("toolUseId"), use.get("name")
        if not isinstance(call_id, str) or not isinstance(name, str):
            raise UpstreamProtocolError("upstream toolUse start has no toolUseId or name")
        return self._opening(index, "toolUse", ToolCall(call_id, name, ""))

    def _delta(self, event: dict[str, Any]) -> list[stream.StreamEvent]:
        index = self._index(event)
        delta = event.get("delta")
        if not isinstance(delta, dict):
            raise UpstreamProtocolError("upstream contentBlockDelta has no delta")
        events: list[stream.StreamEvent] = []
        if "text" in delta:
            if index not in self._kinds:
                events.extend(self._opening(index, "text", Text("")))
            events.append(stream.TextDelta(index, _string(delta, "text")))
        elif "toolUse" in delta:
            use = delta["toolUse"]
            if self._kinds.get(index) != "toolUse" or not isinstance(use, dict):
                raise UpstreamProtocolError("upstream toolUse delta outside a toolUse block")
            events.append(stream.ArgumentsDelta(index, _string(use, "input")))
        elif "reasoningContent" in delta:
            reasoning = delta["reasoningContent"]
            if not isinstance(reasoning, dict):
                raise UpstreamProtocolError("upstream reasoningContent delta is not an object")
            if index not in self._kinds:
                events.extend(self._opening(index, "reasoning", Thinking("", origin=NAME)))
            if isinstance(reasoning.get("text"), str):
                events.append(stream.ThinkingDelta(index, reasoning["text"]))
            if isinstance(reasoning.get("signature"), str):
                events.append(stream.SignatureDelta(index, reasoning["signature"]))
        return events


def _string(parent: dict[str, Any], key: str) -> str:
    value = parent.get(key)
    if not isinstance(value, str):
        raise UpstreamProtocolError(f"upstream delta has no {key}")
    return value
