"""The formats only upstreams speak: Gemini's generateContent and Bedrock's Converse.

Requests of every client format render into bodies the providers' own parsers accept (Gemini's
strict field names as the loopback Gemini reads them; Bedrock's through botocore's model of the
Converse operation); what a kind cannot carry is refused with a 400 naming the client's field.
Their answers and streams come back in every client format, validated by the official SDKs'
types and folded by the SDKs' own stream accumulators, usage included to the token.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from fmt_requests import PNG
from fmt_support import (
    accumulate_anthropic,
    accumulate_chat,
    accumulate_responses,
    check_response,
    render_stream,
)
from native_bedrock import FakeBedrock
from native_gemini import check_generate_request

from gateway.formats import FORMAT_NAMES, upstream_format, wire_format
from gateway.formats.errors import Untranslatable
from gateway.formats.internal import FormatName, Usage
from gateway.formats.stream import StreamEvent, accumulate

CLOUDS: tuple[FormatName, ...] = ("gemini", "bedrock_converse")
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _request(source: FormatName, **extra: Any) -> dict[str, Any]:
    """A conversation with a system prompt, an inline image, a tool call and its result."""
    if source == "anthropic_messages":
        body: dict[str, Any] = {
            "model": "m",
            "max_tokens": 100,
            "system": "Be brief.",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Weather in Paris?"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                        },
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "t1",
                            "name": "weather",
                            "input": {"city": "Paris"},
                        }
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "18 C"}],
                },
            ],
            "tools": [{"name": "weather", "description": "d", "input_schema": SCHEMA}],
            "tool_choice": {"type": "auto"},
            "temperature": 0.5,
            "stop_sequences": ["END"],
        }
    elif source == "openai_chat":
        body = {
            "model": "m",
            "max_tokens": 100,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Weather in Paris?"},
                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "t1",
                            "type": "function",
                            "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "t1", "content": "18 C"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "weather", "description": "d", "parameters": SCHEMA},
                }
            ],
            "tool_choice": "auto",
            "temperature": 0.5,
            "stop": ["END"],
        }
    else:
        body = {
            "model": "m",
            "max_output_tokens": 100,
            "instructions": "Be brief.",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Weather in Paris?"},
                        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"},
                    ],
                },
                {
                    "type": "function_call",
                    "call_id": "t1",
                    "name": "weather",
                    "arguments": '{"city": "Paris"}',
                },
                {"type": "function_call_output", "call_id": "t1", "output": "18 C"},
            ],
            "tools": [
                {"type": "function", "name": "weather", "description": "d", "parameters": SCHEMA}
            ],
            "tool_choice": "auto",
            "temperature": 0.5,
        }
    return {**body, **extra}


def _render(source: FormatName, target: FormatName, **extra: Any) -> dict[str, Any]:
    request = wire_format(source).parse_request(_request(source, **extra))
    return upstream_format(target).render_request(request, "the-model")


@pytest.mark.parametrize("source", FORMAT_NAMES)
def test_a_conversation_renders_as_gemini_reads_it(source: FormatName) -> None:
    body = _render(source, "gemini")
    assert body.pop("model") == "the-model"
    assert check_generate_request(body) is None
    assert body["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    user, model, result = body["contents"]
    assert user["parts"][1] == {"inlineData": {"mimeType": "image/png", "data": PNG}}
    call = model["parts"][0]
    assert call["functionCall"] == {"name": "weather", "args": {"city": "Paris"}}
    assert call["thoughtSignature"]  # another provider's call: Google's placeholder
    response = result["parts"][0]["functionResponse"]
    assert response == {"name": "weather", "response": {"result": "18 C"}}
    declaration = body["tools"][0]["functionDeclarations"][0]
    assert declaration["parametersJsonSchema"] == SCHEMA
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "AUTO"}}
    assert body["generationConfig"]["maxOutputTokens"] == 100


@pytest.mark.parametrize("source", FORMAT_NAMES)
def test_a_conversation_renders_as_bedrocks_converse_model_reads_it(source: FormatName) -> None:
    body = _render(source, "bedrock_converse")
    model = body.pop("model")
    validator = FakeBedrock.__new__(FakeBedrock)
    from botocore.session import get_session

    validator._converse_shape = (
        get_session().get_service_model("bedrock-runtime").operation_model("Converse").input_shape
    )
    assert validator.validation_problem(body, model, stream=False) is None
    assert body["system"] == [{"text": "Be brief."}]
    image = body["messages"][0]["content"][1]["image"]
    assert image == {"format": "png", "source": {"bytes": PNG}}
    use = body["messages"][1]["content"][0]["toolUse"]
    assert use == {"toolUseId": "t1", "name": "weather", "input": {"city": "Paris"}}
    assert body["messages"][2]["content"][0]["toolResult"]["content"] == [{"text": "18 C"}]
    assert body["toolConfig"]["toolChoice"] == {"auto": {}}
    assert body["inferenceConfig"]["maxTokens"] == 100


@pytest.mark.parametrize("target", CLOUDS)
@pytest.mark.parametrize(
    ("source", "extra", "field"),
    [
        ("openai_chat", {"parallel_tool_calls": False}, "parallel_tool_calls"),
        ("openai_chat", {"n": 2}, "n"),
        ("anthropic_messages", {"container": "c1"}, "container"),
        (
            "anthropic_messages",
            {"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}},
            "tool_choice.disable_parallel_tool_use",
        ),
    ],
)
def test_what_a_cloud_format_cannot_carry_is_refused_by_name(
    target: FormatName, source: FormatName, extra: dict[str, Any], field: str
) -> None:
    with pytest.raises(Untranslatable) as refused:
        _render(source, target, **extra)
    assert refused.value.param == field and refused.value.status == 400


def test_what_only_one_cloud_format_refuses() -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}
    with pytest.raises(Untranslatable) as refused:
        _render("openai_chat", "bedrock_converse", response_format=schema)
    assert refused.value.param == "response_format"
    gemini = _render("openai_chat", "gemini", response_format=schema)
    assert gemini["generationConfig"]["responseJsonSchema"] == SCHEMA
    url_image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    messages = [{"role": "user", "content": [url_image]}]
    with pytest.raises(Untranslatable) as by_url:
        _render("openai_chat", "bedrock_converse", messages=messages, tools=[])
    assert by_url.value.param == "messages[0].content[0]"
    part = _render("openai_chat", "gemini", messages=messages, tools=[])["contents"][0]["parts"][0]
    assert part == {"fileData": {"mimeType": "image/png", "fileUri": "https://example.com/cat.png"}}
    late_system = [*_request("openai_chat")["messages"], {"role": "system", "content": "x"}]
    for target in CLOUDS:
        with pytest.raises(Untranslatable) as system:
            _render("openai_chat", target, messages=late_system)
        assert system.value.param == "messages[4]"
    orphan = [{"role": "tool", "tool_call_id": "nope", "content": "18 C"}]
    with pytest.raises(Untranslatable) as unnamed:
        _render("openai_chat", "gemini", messages=orphan)
    assert unnamed.value.param == "messages[0]" and "'nope'" in unnamed.value.message


GEMINI_ANSWER = {
    "candidates": [
        {
            "content": {
                "role": "model",
                "parts": [
                    {"text": "Let me check.", "thoughtSignature": "c2ln"},
                    {"functionCall": {"name": "weather", "args": {"city": "Paris"}}},
                ],
            },
            "finishReason": "STOP",
        }
    ],
    "usageMetadata": {
        "promptTokenCount": 40,
        "cachedContentTokenCount": 8,
        "candidatesTokenCount": 12,
        "thoughtsTokenCount": 5,
        "totalTokenCount": 57,
    },
    "modelVersion": "gemini-2.5-flash",
    "responseId": "r1",
}
GEMINI_USAGE = Usage(prompt_tokens=40, completion_tokens=17, cached_tokens=8, reasoning_tokens=5)
CONVERSE_ANSWER = {
    "output": {
        "message": {
            "role": "assistant",
            "content": [
                {"text": "Let me check."},
                {"toolUse": {"toolUseId": "tu1", "name": "weather", "input": {"city": "Paris"}}},
            ],
        }
    },
    "stopReason": "tool_use",
    "usage": {
        "inputTokens": 10,
        "outputTokens": 12,
        "totalTokens": 92,
        "cacheReadInputTokens": 40,
        "cacheWriteInputTokens": 30,
    },
}
CONVERSE_USAGE = Usage(
    prompt_tokens=80, completion_tokens=12, cached_tokens=40, cache_write_tokens=30
)


def _gemini_stream() -> list[bytes]:
    chunks: list[dict[str, Any]] = [
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "Let "}]}}]},
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "me check."}]}}]},
        {
            "candidates": [
                {
                    "content": {
                        "role": "model",
                        "parts": [
                            {
                                "functionCall": {"name": "weather", "args": {"city": "Paris"}},
                                "thoughtSignature": "c2ln",
                            }
                        ],
                    },
                    "finishReason": "STOP",
                }
            ],
            "usageMetadata": GEMINI_ANSWER["usageMetadata"],
        },
    ]
    return [
        orjson.dumps({**c, "modelVersion": "gemini-2.5-flash", "responseId": "r1"}) for c in chunks
    ]


def _converse_stream() -> list[bytes]:
    events: list[dict[str, Any]] = [
        {"messageStart": {"role": "assistant"}},
        {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"text": "Let "}}},
        {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"text": "me check."}}},
        {"contentBlockStop": {"contentBlockIndex": 0}},
        {
            "contentBlockStart": {
                "contentBlockIndex": 1,
                "start": {"toolUse": {"toolUseId": "tu1", "name": "weather"}},
            }
        },
        {"contentBlockDelta": {"contentBlockIndex": 1, "delta": {"toolUse": {"input": '{"city"'}}}},
        {
            "contentBlockDelta": {
                "contentBlockIndex": 1,
                "delta": {"toolUse": {"input": ': "Paris"}'}},
            }
        },
        {"contentBlockStop": {"contentBlockIndex": 1}},
        {"messageStop": {"stopReason": "tool_use"}},
        {"metadata": {"usage": CONVERSE_ANSWER["usage"], "metrics": {"latencyMs": 5}}},
    ]
    return [orjson.dumps(event) for event in events]


CASES = {
    "gemini": (GEMINI_ANSWER, _gemini_stream, GEMINI_USAGE),
    "bedrock_converse": (CONVERSE_ANSWER, _converse_stream, CONVERSE_USAGE),
}


@pytest.mark.parametrize("client", FORMAT_NAMES)
@pytest.mark.parametrize("upstream", CLOUDS)
def test_an_answer_reaches_every_client_format(upstream: FormatName, client: FormatName) -> None:
    answer, _, usage = CASES[upstream]
    response = upstream_format(upstream).parse_response(answer)
    assert response.usage == usage and response.stop_reason == "tool_use"
    model = check_response(client, wire_format(client).render_response(response, None))
    if client == "anthropic_messages":
        call = next(block for block in model.content if block.type == "tool_use")
        assert call.input == {"city": "Paris"} and model.stop_reason == "tool_use"
    elif client == "openai_chat":
        call = model.choices[0].message.tool_calls[0]
        assert orjson.loads(call.function.arguments) == {"city": "Paris"}
    else:
        call = next(item for item in model.output if item.type == "function_call")
        assert orjson.loads(call.arguments) == {"city": "Paris"}


def _parsed(upstream: FormatName) -> list[StreamEvent]:
    parser = upstream_format(upstream).StreamParser()
    events: list[StreamEvent] = []
    for payload in CASES[upstream][1]():
        events.extend(parser.feed(payload))
    events.extend(parser.close())
    return events


@pytest.mark.parametrize("upstream", CLOUDS)
def test_a_stream_parses_into_what_the_answer_says(upstream: FormatName) -> None:
    streamed = accumulate(_parsed(upstream))
    whole = upstream_format(upstream).parse_response(CASES[upstream][0])
    assert streamed.usage == whole.usage == CASES[upstream][2]
    assert streamed.stop_reason == whole.stop_reason == "tool_use"
    texts = "".join(getattr(block, "text", "") for block in streamed.content)
    assert texts == "Let me check."
    calls = [block for block in streamed.content if type(block).__name__ == "ToolCall"]
    assert len(calls) == 1 and orjson.loads(calls[0].arguments) == {"city": "Paris"}


@pytest.mark.parametrize("upstream", CLOUDS)
def test_a_stream_reaches_every_client_through_the_sdks(upstream: FormatName) -> None:
    events = _parsed(upstream)
    usage = CASES[upstream][2]
    message = accumulate_anthropic(render_stream("anthropic_messages", events))
    assert message.stop_reason == "tool_use"
    assert message.usage.output_tokens == usage.completion_tokens
    chat_request = wire_format("openai_chat").parse_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    completion = accumulate_chat(render_stream("openai_chat", events, chat_request))
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage is not None and completion.usage.prompt_tokens == usage.prompt_tokens
    responses_request = wire_format("openai_responses").parse_request(
        {"model": "m", "input": "x", "stream": True}
    )
    final, _ = accumulate_responses(render_stream("openai_responses", events, responses_request))
    assert final.usage is not None and final.usage.input_tokens == usage.prompt_tokens


@pytest.mark.parametrize("upstream", CLOUDS)
def test_a_stream_cut_short_is_an_error(upstream: FormatName) -> None:
    parser = upstream_format(upstream).StreamParser()
    for payload in CASES[upstream][1]()[:2]:
        parser.feed(payload)
    (ended,) = parser.close()
    assert type(ended).__name__ == "StreamError"


def test_upstream_errors_read_as_every_provider_says_them() -> None:
    gemini, converse = upstream_format("gemini"), upstream_format("bedrock_converse")
    exhausted = {"error": {"code": 429, "message": "Quota", "status": "RESOURCE_EXHAUSTED"}}
    assert gemini.parse_error(429, orjson.dumps(exhausted)).kind == "rate_limit"
    long = {
        "error": {
            "code": 400,
            "status": "INVALID_ARGUMENT",
            "message": "The input token count (900) exceeds the maximum number of tokens allowed (16).",
        }
    }
    assert gemini.parse_error(400, orjson.dumps(long)).code == "context_length_exceeded"
    mid_stream = gemini.parse_error(None, {"error": {"code": 503, "status": "UNAVAILABLE"}})
    assert (mid_stream.status, mid_stream.kind) == (503, "overloaded")
    throttled = converse.parse_error(None, {"throttlingException": {"message": "Slow down"}})
    assert (throttled.status, throttled.kind, throttled.message) == (429, "rate_limit", "Slow down")
    too_long = converse.parse_error(400, b'{"message": "Input is too long for requested model."}')
    assert too_long.code == "context_length_exceeded"
