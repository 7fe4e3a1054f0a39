"""Helpers for the format tests: SSE on the wire, the official SDKs' types as validators, and the
SDKs' own stream accumulators.

Every rendered body and event is checked against the ``anthropic`` and ``openai`` packages'
pydantic models (``TypeAdapter`` for unions and request ``TypedDict``s), so a field name or
event shape that drifts from the real APIs fails here.
"""

from __future__ import annotations

from typing import Any

import orjson
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types import message_create_params as anthropic_params
from anthropic.types.shared import ErrorResponse
from openai import omit
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses import response_create_params as responses_params
from pydantic import TypeAdapter

from gateway.formats import wire_format
from gateway.formats.internal import FormatName
from gateway.formats.sse import SSEDecoder, encode_sse
from gateway.formats.stream import StreamEvent

REQUEST_TYPES = {
    "anthropic_messages": TypeAdapter(anthropic_params.MessageCreateParamsNonStreaming),
    "openai_chat": TypeAdapter(chat_params.CompletionCreateParamsNonStreaming),
    "openai_responses": TypeAdapter(responses_params.ResponseCreateParamsNonStreaming),
}
ANTHROPIC_EVENT = TypeAdapter(RawMessageStreamEvent)
RESPONSES_EVENT = TypeAdapter(ResponseStreamEvent)


def force(value: Any) -> Any:
    """Walks a validated TypedDict so pydantic's lazy iterables validate every item."""
    if isinstance(value, dict):
        return {key: force(item) for key, item in value.items()}
    if isinstance(value, list | tuple) or type(value).__name__ == "ValidatorIterator":
        return [force(item) for item in value]
    return value


def check_request(name: FormatName, body: dict[str, Any]) -> None:
    """A rendered request must be a valid create-params body for the official SDK."""
    streamless = {
        key: value for key, value in body.items() if key not in ("stream", "stream_options")
    }
    force(REQUEST_TYPES[name].validate_python(orjson.loads(orjson.dumps(streamless))))


def check_response(name: FormatName, body: dict[str, Any]) -> Any:
    """A rendered response, validated as the SDK's model (which is returned)."""
    data = orjson.loads(orjson.dumps(body))
    model = {
        "anthropic_messages": Message,
        "openai_chat": ChatCompletion,
        "openai_responses": Response,
    }[name]
    return model.model_validate(data)


def sse(events: list[tuple[str | None, Any]]) -> bytes:
    """Encodes (event name, data) pairs; data is JSON-encoded unless it is already bytes."""
    out = b""
    for name, data in events:
        out += encode_sse(data if isinstance(data, bytes) else orjson.dumps(data), name)
    return out


def decode(raw: bytes, chunk: int = 7) -> list[tuple[str | None, str]]:
    """(event, data) pairs of an SSE byte stream fed in small chunks, as a network delivers it."""
    decoder = SSEDecoder()
    events = []
    for start in range(0, len(raw), chunk):
        events.extend(decoder.feed(raw[start : start + chunk]))
    events.extend(decoder.close())
    return [(event.event, event.data) for event in events]


def parse_stream(name: FormatName, raw: bytes) -> list[StreamEvent]:
    parser = wire_format(name).StreamParser()
    events: list[StreamEvent] = []
    for _, data in decode(raw):
        events.extend(parser.feed(data))
    events.extend(parser.close())
    return events


def render_stream(name: FormatName, events: list[StreamEvent], request: Any = None) -> bytes:
    renderer = wire_format(name).StreamRenderer(request)
    return b"".join(renderer.render(event) for event in events)


def accumulate_anthropic(raw: bytes) -> Message:
    """Every event validated as the SDK's type, then folded by the SDK's own accumulator."""
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for name, data in decode(raw):
        payload = orjson.loads(data)
        assert payload["type"] == name, "the SSE event name must match the data's type"
        event = ANTHROPIC_EVENT.validate_python(payload)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None
    return Message.model_validate(snapshot.model_dump())


def accumulate_chat(raw: bytes, tools: list[dict[str, Any]] | None = None) -> ChatCompletion:
    state = ChatCompletionStreamState(input_tools=tools or [])
    pairs = decode(raw)
    assert pairs[-1] == (None, "[DONE]")
    for name, data in pairs[:-1]:
        assert name is None
        list(state.handle_chunk(ChatCompletionChunk.model_validate_json(data)))
    # The snapshot, not get_final_completion(): that raises for length and content_filter.
    return ChatCompletion.model_validate(state.current_completion_snapshot.model_dump())


def accumulate_responses(raw: bytes) -> tuple[Response, dict[str, str]]:
    """The final response, and the text and arguments the SDK's delta snapshots reached."""
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    final: Response | None = None
    snapshots: dict[str, str] = {}
    for sequence, (name, data) in enumerate(decode(raw)):
        payload = orjson.loads(data)
        assert payload["type"] == name
        assert payload["sequence_number"] == sequence
        event = RESPONSES_EVENT.validate_python(payload)
        for handled in state.handle_event(event):
            if handled.type in (
                "response.output_text.delta",
                "response.function_call_arguments.delta",
            ):
                snapshots[handled.item_id] = handled.snapshot
            if handled.type in ("response.completed", "response.incomplete"):
                final = Response.model_validate(handled.response.model_dump())
    assert final is not None
    return final, snapshots


def check_error(name: FormatName, body: dict[str, Any]) -> None:
    if name == "anthropic_messages":
        ErrorResponse.model_validate(body)
    else:
        assert set(body) == {"error"}
        assert set(body["error"]) == {"message", "type", "param", "code"}
