"""Streams: each format's real-shaped SSE parsed into internal events and rendered into every
format, every rendered event validated with the official SDK's types and folded by the SDK's
own accumulator into the expected final message."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fmt_samples import (
    ANTHROPIC_STREAM,
    SAID,
    SIGNATURE,
    THOUGHT,
    USAGE,
    WEATHER_TOOL_ARGS,
    chat_stream,
    responses_stream,
)
from fmt_support import (
    accumulate_anthropic,
    accumulate_chat,
    accumulate_responses,
    parse_stream,
    render_stream,
    sse,
)

from gateway.formats import FORMAT_NAMES, wire_format
from gateway.formats.errors import UpstreamProtocolError
from gateway.formats.internal import (
    ChatRequest,
    RedactedThinking,
    Refusal,
    Text,
    Thinking,
    ToolCall,
    Usage,
)
from gateway.formats.stream import (
    ArgumentsDelta,
    BlockStart,
    BlockStop,
    MessageDelta,
    MessageStart,
    MessageStop,
    StreamAccumulator,
    StreamError,
    TextDelta,
    accumulate,
)

SOURCES = {
    "anthropic": ("anthropic_messages", sse(ANTHROPIC_STREAM)),
    "chat": ("openai_chat", sse(chat_stream(reasoning=False))),
    "chat+reasoning": ("openai_chat", sse(chat_stream(reasoning=True))),
    "responses": ("openai_responses", sse(responses_stream())),
}


# The samples' usage in an OpenAI SDK's terms: prompt, completion and total tokens, then the
# prompt's cache reads and writes and the completion's reasoning tokens.
OPENAI_USAGE = (622, 89, 711, 100, 50, 30)


def _has_thinking(source: str) -> bool:
    return source != "chat"


def _openai_usage(usage: Any, prompt: str, completion: str) -> tuple[int, ...]:
    """``usage`` of the Chat or Responses SDK in ``OPENAI_USAGE``'s order: the two name the
    same counts ``prompt``/``completion`` and ``input``/``output``."""
    prompt_details = getattr(usage, f"{prompt}_tokens_details")
    completion_details = getattr(usage, f"{completion}_tokens_details")
    return (
        getattr(usage, f"{prompt}_tokens"),
        getattr(usage, f"{completion}_tokens"),
        usage.total_tokens,
        prompt_details.cached_tokens,
        prompt_details.cache_write_tokens,
        completion_details.reasoning_tokens,
    )


@pytest.mark.parametrize("source", SOURCES)
def test_parse_gives_the_whole_story(source: str) -> None:
    name, raw = SOURCES[source]
    events = parse_stream(name, raw)
    assert isinstance(events[0], MessageStart)
    assert isinstance(events[-2], MessageDelta) and isinstance(events[-1], MessageStop)
    response = accumulate(events)
    texts = [block.text for block in response.content if isinstance(block, Text)]
    calls = [block for block in response.content if isinstance(block, ToolCall)]
    thoughts = [block for block in response.content if isinstance(block, Thinking)]
    assert texts == [SAID]
    assert [(call.name, json.loads(call.arguments)) for call in calls] == [
        ("get_weather", WEATHER_TOOL_ARGS)
    ]
    assert [t.text for t in thoughts] == ([THOUGHT] if _has_thinking(source) else [])
    if source == "anthropic":
        assert thoughts[0].signature == SIGNATURE
    if source == "responses":
        assert thoughts[0].item_id and thoughts[0].signature  # encrypted_content kept
    assert response.stop_reason == "tool_use"
    assert response.usage == USAGE  # every format's usage fields land in one exact record
    # Arguments arrive as the upstream's own pieces, not re-chunked.
    pieces = [event.json for event in events if isinstance(event, ArgumentsDelta)]
    assert "".join(pieces) == '{"city": "Paris", "unit": "c"}' and len(pieces) >= 2


@pytest.mark.parametrize("source", SOURCES)
def test_render_as_anthropic_sdk_accumulates_it(source: str) -> None:
    name, raw = SOURCES[source]
    message = accumulate_anthropic(render_stream("anthropic_messages", parse_stream(name, raw)))
    kinds = [block.type for block in message.content]
    assert kinds == (["thinking"] if _has_thinking(source) else []) + ["text", "tool_use"]
    text = next(block for block in message.content if block.type == "text")
    call = next(block for block in message.content if block.type == "tool_use")
    assert text.text == SAID
    assert call.name == "get_weather" and call.input == WEATHER_TOOL_ARGS
    assert message.stop_reason == "tool_use"
    # Anthropic counts cache reads and writes apart from input_tokens.
    assert message.usage.input_tokens == 472
    assert message.usage.cache_read_input_tokens == 100
    assert message.usage.cache_creation_input_tokens == 50
    assert message.usage.output_tokens == 89


@pytest.mark.parametrize("source", SOURCES)
def test_render_as_chat_sdk_accumulates_it(source: str) -> None:
    name, raw = SOURCES[source]
    request = ChatRequest(model="m", source="openai_chat", messages=[], include_usage=True)
    completion = accumulate_chat(render_stream("openai_chat", parse_stream(name, raw), request))
    choice = completion.choices[0]
    assert choice.message.content == SAID
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == WEATHER_TOOL_ARGS
    assert _openai_usage(completion.usage, "prompt", "completion") == OPENAI_USAGE


@pytest.mark.parametrize("source", SOURCES)
def test_render_as_responses_sdk_accumulates_it(source: str) -> None:
    name, raw = SOURCES[source]
    response, snapshots = accumulate_responses(
        render_stream("openai_responses", parse_stream(name, raw))
    )
    kinds = [item.type for item in response.output]
    assert kinds == (["reasoning"] if _has_thinking(source) else []) + ["message", "function_call"]
    assert response.status == "completed"
    assert response.output_text == SAID
    call = response.output[-1]
    assert call.name == "get_weather" and json.loads(call.arguments) == WEATHER_TOOL_ARGS
    # The SDK's own delta snapshots reached the same final text and arguments.
    assert snapshots[response.output[-2].id] == SAID
    assert snapshots[call.id] == call.arguments
    if _has_thinking(source):
        assert response.output[0].summary[0].text == THOUGHT
    assert _openai_usage(response.usage, "input", "output") == OPENAI_USAGE


@pytest.mark.parametrize("target", FORMAT_NAMES)
@pytest.mark.parametrize("source", SOURCES)
def test_rendered_stream_parses_back_to_the_same_answer(source: str, target: str) -> None:
    """source -> internal -> target bytes -> internal: nothing but what the target lacks is lost."""
    name, raw = SOURCES[source]
    first = accumulate(parse_stream(name, raw))
    request = ChatRequest(model="m", source="openai_chat", messages=[], include_usage=True)
    again = accumulate(
        parse_stream(target, render_stream(target, parse_stream(name, raw), request))
    )
    assert again.usage == first.usage == USAGE
    assert again.stop_reason == first.stop_reason

    def visible(response):
        return [
            (
                type(b).__name__,
                getattr(b, "text", None),
                getattr(b, "name", None),
                getattr(b, "arguments", None),
            )
            for b in response.content
        ]

    assert visible(again) == visible(first)


def test_chat_renderer_sends_usage_only_when_asked() -> None:
    events = parse_stream("anthropic_messages", sse(ANTHROPIC_STREAM))
    quiet = ChatRequest(model="m", source="openai_chat", messages=[])
    raw = render_stream("openai_chat", events, quiet)
    assert b'"usage"' not in raw
    completion = accumulate_chat(raw)
    assert completion.usage is None and completion.choices[0].message.content == SAID


def test_chat_parser_finishes_without_done_and_reports_a_cut_stream() -> None:
    chunks = chat_stream(reasoning=False)
    without_done = parse_stream("openai_chat", sse(chunks[:-1]))
    assert isinstance(without_done[-1], MessageStop)
    assert accumulate(without_done).usage == USAGE
    cut = parse_stream("openai_chat", sse(chunks[:4]))
    assert isinstance(cut[-1], StreamError) and cut[-1].error.status == 502


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("anthropic_messages", sse(ANTHROPIC_STREAM[:8])),
        ("openai_responses", sse(responses_stream()[:12])),
    ],
)
def test_cut_streams_end_in_an_error(name: str, raw: bytes) -> None:
    events = parse_stream(name, raw)
    assert isinstance(events[-1], StreamError)
    assert events[-1].error.message == "the upstream stream ended early"


def test_anthropic_error_event_mid_stream() -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    events = parse_stream("anthropic_messages", sse([*ANTHROPIC_STREAM[:8], ("error", error)]))
    assert isinstance(events[-1], StreamError)
    assert (events[-1].error.status, events[-1].error.kind) == (529, "overloaded")


@pytest.mark.parametrize("target", FORMAT_NAMES)
def test_stream_errors_render_in_each_format(target: str) -> None:
    events = parse_stream(
        "anthropic_messages",
        sse(
            [
                *ANTHROPIC_STREAM[:8],
                (
                    "error",
                    {
                        "type": "error",
                        "error": {"type": "rate_limit_error", "message": "slow down"},
                    },
                ),
            ]
        ),
    )
    raw = render_stream(target, events)
    tail = raw.rsplit(b"\n\n", 2)
    assert b"slow down" in raw
    if target == "anthropic_messages":
        assert tail[-2].startswith(b"event: error\ndata: ")
        assert json.loads(tail[-2].split(b"data: ", 1)[1])["error"]["type"] == "rate_limit_error"
    elif target == "openai_chat":
        body = json.loads(tail[-2].split(b"data: ", 1)[1])
        assert body["error"]["code"] == "rate_limit_exceeded"
    else:
        assert b"event: response.failed" in tail[-2]
        assert b"event: error" in raw


def test_open_blocks_follow_the_upstream_order() -> None:
    """Chat deltas open and close blocks in order: reasoning, then text, then the tool call."""
    events = parse_stream("openai_chat", sse(chat_stream(reasoning=True)))
    starts = [type(e.block).__name__ for e in events if isinstance(e, BlockStart)]
    assert starts == ["Thinking", "Text", "ToolCall"]
    stops = [e.index for e in events if isinstance(e, BlockStop)]
    assert stops == [0, 1, 2]
    assert [e.text for e in events if isinstance(e, TextDelta)] == [SAID[:11], SAID[11:]]


def test_responses_text_sent_only_in_done_events_is_not_lost() -> None:
    """Some providers send a part's text only in ``.done``; the parser emits it as one delta."""
    stream = [
        (name, data)
        for name, data in responses_stream()
        if name not in ("response.output_text.delta", "response.function_call_arguments.delta")
    ]
    response = accumulate(parse_stream("openai_responses", sse(stream)))
    assert [b.text for b in response.content if isinstance(b, Text)] == [SAID]
    assert [json.loads(b.arguments) for b in response.content if isinstance(b, ToolCall)] == [
        WEATHER_TOOL_ARGS
    ]


def test_interleaved_tool_call_deltas_are_refused() -> None:
    chunks = chat_stream(reasoning=False)
    second = {
        **chunks[4][1],
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 1,
                            "id": "call_2",
                            "type": "function",
                            "function": {"name": "other", "arguments": "{}"},
                        }
                    ]
                },
                "finish_reason": None,
            }
        ],
    }
    back = {**chunks[5][1]}
    with pytest.raises(UpstreamProtocolError, match="interleaved"):
        parse_stream("openai_chat", sse([*chunks[:5], (None, second), (None, back)]))


def test_wire_format_lookup() -> None:
    assert wire_format("openai_chat").NAME == "openai_chat"
    with pytest.raises(ValueError, match="unknown wire format"):
        wire_format("gemini")  # type: ignore[arg-type]


def test_azure_leading_filter_chunk_is_skipped() -> None:
    """Azure OpenAI opens with a chunk of prompt_filter_results: no id, no model, no choices."""
    azure = {
        "id": "",
        "object": "",
        "created": 0,
        "model": "",
        "choices": [],
        "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}],
    }
    events = parse_stream("openai_chat", sse([(None, azure), *chat_stream(reasoning=False)]))
    start = events[0]
    assert isinstance(start, MessageStart) and start.id == "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG"
    assert accumulate(events).usage == USAGE


def test_responses_deltas_without_content_part_added() -> None:
    stream = [
        (name, data) for name, data in responses_stream() if name != "response.content_part.added"
    ]
    response = accumulate(parse_stream("openai_responses", sse(stream)))
    assert [b.text for b in response.content if isinstance(b, Text)] == [SAID]


def _synthetic(stop: str) -> list:
    return [
        MessageStart("msg_1", "m", Usage(prompt_tokens=10)),
        BlockStart(0, RedactedThinking("opaque")),
        BlockStop(0),
        BlockStart(1, Text("")),
        TextDelta(1, "partial ans"),
        BlockStop(1),
        BlockStart(2, Refusal("")),
        TextDelta(2, "I can't."),
        BlockStop(2),
        MessageDelta(stop, Usage(prompt_tokens=10, completion_tokens=4)),  # type: ignore[arg-type]
        MessageStop(),
    ]


@pytest.mark.parametrize("stop", ["max_tokens", "refusal", "end_turn"])
def test_refusal_redacted_thinking_and_cut_answers_in_every_format(stop: str) -> None:
    events = _synthetic(stop)
    message = accumulate_anthropic(render_stream("anthropic_messages", events))
    assert [b.type for b in message.content] == ["redacted_thinking", "text", "text"]
    assert message.stop_reason == stop and message.usage.output_tokens == 4
    chat = accumulate_chat(
        render_stream(
            "openai_chat", events, ChatRequest("m", "openai_chat", [], include_usage=True)
        )
    )
    assert chat.choices[0].message.content == "partial ans"
    assert chat.choices[0].message.refusal == "I can't."
    assert (
        chat.choices[0].finish_reason
        == {"max_tokens": "length", "refusal": "content_filter", "end_turn": "stop"}[stop]
    )
    response, _ = accumulate_responses(render_stream("openai_responses", events))
    assert [item.type for item in response.output] == ["message", "message"]  # redacted: no item
    assert response.output[1].content[0].type == "refusal"
    status, reason = {
        "max_tokens": ("incomplete", "max_output_tokens"),
        "refusal": ("incomplete", "content_filter"),
        "end_turn": ("completed", None),
    }[stop]
    assert response.status == status
    assert (response.incomplete_details.reason if response.incomplete_details else None) == reason


def test_accumulator_rejects_a_broken_order() -> None:
    for broken in (
        [TextDelta(0, "x")],
        [MessageStart("i", "m"), BlockStart(0, Text("")), BlockStart(1, Text(""))],
        [MessageStart("i", "m"), BlockStart(0, Text("")), ArgumentsDelta(0, "{}")],
        [MessageStart("i", "m"), BlockStart(0, Text("")), MessageDelta("end_turn")],
        [MessageStart("i", "m"), MessageStop(), MessageStop()],
    ):
        accumulator = StreamAccumulator()
        with pytest.raises(UpstreamProtocolError):
            for event in broken:
                accumulator.add(event)
