"""Requests: every format parsed and rendered into every format, the result validated as the
official SDK's create-params and checked field by field; refusals name the client's field."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from fmt_requests import PNG, WEATHER_SCHEMA, anthropic_request, chat_request, responses_request
from fmt_support import check_request

from gateway.formats import FORMAT_NAMES, wire_format
from gateway.formats.errors import MalformedRequest, Untranslatable

SOURCES = {
    "anthropic_messages": anthropic_request,
    "openai_chat": lambda **kw: chat_request(**{"stop": None, **kw}),
    "openai_responses": responses_request,
}


def _without_paths(value: Any) -> Any:
    """Internal objects as plain data, without where each item sat in its body."""
    if dataclasses.is_dataclass(value):
        fields = {f.name: _without_paths(getattr(value, f.name)) for f in dataclasses.fields(value)}
        fields.pop("path", None)
        return (type(value).__name__, fields)
    if isinstance(value, list):
        return [_without_paths(item) for item in value]
    return value


def translate(source: str, body: dict[str, Any], target: str) -> dict[str, Any]:
    out = wire_format(target).render_request(
        wire_format(source).parse_request(body), "target-model"
    )  # type: ignore[arg-type]
    check_request(target, out)  # type: ignore[arg-type]
    assert out["model"] == "target-model"
    return out


@pytest.mark.parametrize("target", FORMAT_NAMES)
@pytest.mark.parametrize("source", FORMAT_NAMES)
def test_every_pair_renders_a_valid_request(source: str, target: str) -> None:
    translate(source, SOURCES[source](), target)


def test_anthropic_to_chat() -> None:
    out = translate("anthropic_messages", anthropic_request(), "openai_chat")
    system, user, assistant, tool_a, tool_b, after = out["messages"]
    assert system == {
        "role": "system",
        "content": [
            {"type": "text", "text": "You are a weather assistant."},
            {"type": "text", "text": "Answer briefly."},  # cache_control dropped: a hint
        ],
    }
    assert user["content"][1] == {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{PNG}"},
    }
    assert user["content"][2] == {
        "type": "image_url",
        "image_url": {"url": "https://example.com/cat.jpg"},
    }
    assert assistant["content"] == "Checking both."  # thinking is not resent to OpenAI
    assert [(c["id"], json.loads(c["function"]["arguments"])) for c in assistant["tool_calls"]] == [
        ("toolu_01A", {"city": "Paris"}),
        ("toolu_01B", {"city": "Rome", "unit": "c"}),
    ]
    assert tool_a == {"role": "tool", "tool_call_id": "toolu_01A", "content": "18°C, cloudy"}
    assert tool_b == {"role": "tool", "tool_call_id": "toolu_01B", "content": "service unavailable"}
    assert after == {"role": "user", "content": "Try Rome again later."}
    assert out["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": WEATHER_SCHEMA,
            },
        }
    ]
    assert out["parallel_tool_calls"] is False and out["tool_choice"] == "auto"
    assert (out["max_completion_tokens"], out["temperature"], out["top_p"], out["user"]) == (
        1024,
        0.5,
        0.9,
        "user-42",
    )
    assert out["stream_options"] == {"include_usage": True}  # the gateway meters from it
    assert "reasoning_effort" not in out  # a thinking budget has no OpenAI equivalent


def test_chat_to_anthropic() -> None:
    out = translate("openai_chat", chat_request(stop=["END"]), "anthropic_messages")
    assert out["system"] == "You are a weather assistant."
    roles = [m["role"] for m in out["messages"]]
    assert roles == [
        "user",
        "assistant",
        "user",
        "system",
        "user",
    ]  # the developer message stays in place
    user = out["messages"][0]["content"]
    assert user[1] == {
        "type": "image",
        "source": {"type": "url", "url": "https://example.com/cat.jpg"},
    }
    assert user[2]["source"] == {"type": "base64", "media_type": "image/png", "data": PNG}
    assert out["messages"][1]["content"][0] == {
        "type": "tool_use",
        "id": "call_1",
        "name": "get_weather",
        "input": {"city": "Paris"},
    }
    # Consecutive tool messages become one user turn of tool results.
    assert out["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "18°C, cloudy"},
        {"type": "tool_result", "tool_use_id": "call_2", "content": "21°C, sunny"},
    ]
    assert out["stop_sequences"] == ["END"]
    assert out["max_tokens"] == 500 and out["metadata"] == {"user_id": "user-42"}
    assert out["output_config"] == {
        "format": {
            "type": "json_schema",
            "schema": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
        "effort": "high",
    }
    assert out["tools"][0]["input_schema"] == WEATHER_SCHEMA and out["tools"][0]["strict"] is True
    assert "seed" not in out and "team" not in json.dumps(out)  # seed and metadata: dropped


def test_chat_without_max_tokens_gets_anthropic_default() -> None:
    body = chat_request()
    del body["max_completion_tokens"]
    request = wire_format("openai_chat").parse_request(body)
    assert wire_format("anthropic_messages").render_request(request, "m")["max_tokens"] == 4096
    render = wire_format("anthropic_messages").render_request
    assert render(request, "m", default_max_tokens=64000)["max_tokens"] == 64000  # type: ignore[call-arg]


def test_responses_to_chat_and_anthropic() -> None:
    chat = translate("openai_responses", responses_request(), "openai_chat")
    assert [m["role"] for m in chat["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert chat["messages"][1]["content"][1]["image_url"]["detail"] == "low"
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["response_format"]["json_schema"]["name"] == "forecast"
    assert chat["reasoning_effort"] == "medium" and chat["max_completion_tokens"] == 800
    anthropic = translate("openai_responses", responses_request(), "anthropic_messages")
    assert anthropic["tool_choice"] == {"type": "tool", "name": "get_weather"}
    # OpenAI's reasoning item cannot be verified by Anthropic, so it is not resent.
    assert all(b["type"] != "thinking" for m in anthropic["messages"] for b in m["content"])


def test_chat_and_anthropic_to_responses() -> None:
    out = translate("openai_chat", chat_request(stop=None), "openai_responses")
    assert out["instructions"] == "You are a weather assistant."
    kinds = [item.get("type") for item in out["input"]]
    assert kinds == [
        "message",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
        "message",
        "message",
    ]
    assert out["text"]["format"]["name"] == "summary" and out["reasoning"] == {"effort": "high"}
    assert out["store"] is False
    out = translate("anthropic_messages", anthropic_request(), "openai_responses")
    assert out["tools"][0]["strict"] is False  # the Responses default is true; the others' false
    assert out["input"][0]["role"] == "system" and len(out["input"][0]["content"]) == 2


@pytest.mark.parametrize("source", FORMAT_NAMES)
def test_same_format_round_trip_keeps_every_field(source: str) -> None:
    body = SOURCES[source]()
    out = translate(source, body, source)
    again = translate(source, out, source)
    assert again == out  # a fixed point: parse and render agree
    conversation = {"messages", "input"}
    for key in body.keys() - {"model"} - conversation:
        assert out.get(key) == body[key], key
    # The conversation may be written in a normal form (a lone text block as a string, the
    # developer role as system), but it means the same: it parses to the same internal turns.
    parse = wire_format(source).parse_request  # type: ignore[arg-type]
    assert _without_paths(parse(out).messages) == _without_paths(parse(body).messages)
    assert _without_paths(parse(out).system) == _without_paths(parse(body).system)
    if source == "openai_responses":
        reasoning = out["input"][1]
        assert reasoning == responses_request()["input"][1]  # OpenAI's own reasoning survives


def test_unknown_fields_travel_only_to_their_own_format() -> None:
    body = chat_request(chat_template_kwargs={"enable_thinking": False}, stop=None)
    assert translate("openai_chat", body, "openai_chat")["chat_template_kwargs"] == {
        "enable_thinking": False
    }
    assert "chat_template_kwargs" not in translate("openai_chat", body, "anthropic_messages")
    body = anthropic_request(service_tier="auto")
    assert translate("anthropic_messages", body, "anthropic_messages")["service_tier"] == "auto"
    assert "service_tier" not in translate("anthropic_messages", body, "openai_chat")


# -- what a target cannot carry: a 400 naming the client's field -------------------------------

REFUSED = [
    ("openai_chat", {"n": 2}, "anthropic_messages", "n"),
    ("openai_chat", {"n": 2}, "openai_responses", "n"),
    ("openai_chat", {"presence_penalty": 0.5}, "anthropic_messages", "presence_penalty"),
    ("openai_chat", {"frequency_penalty": -1}, "openai_responses", "frequency_penalty"),
    ("openai_chat", {"logprobs": True}, "anthropic_messages", "logprobs"),
    ("openai_chat", {"logit_bias": {"50256": -100}}, "openai_responses", "logit_bias"),
    ("openai_chat", {"temperature": 1.5}, "anthropic_messages", "temperature"),
    (
        "openai_chat",
        {"response_format": {"type": "json_object"}},
        "anthropic_messages",
        "response_format",
    ),
    ("openai_chat", {"stop": ["END"]}, "openai_responses", "stop"),
    ("openai_chat", {"audio": {"voice": "alloy", "format": "wav"}}, "anthropic_messages", "audio"),
    ("anthropic_messages", {"top_k": 40}, "openai_chat", "top_k"),
    ("anthropic_messages", {"top_k": 40}, "openai_responses", "top_k"),
    ("anthropic_messages", {"stop_sequences": ["END"]}, "openai_responses", "stop_sequences"),
    ("anthropic_messages", {"max_tokens": 0}, "openai_chat", "max_tokens"),
    ("anthropic_messages", {"container": "container_1"}, "openai_chat", "container"),
    (
        "anthropic_messages",
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "openai_chat",
        "tools[0]",
    ),
    ("openai_responses", {"tools": [{"type": "web_search"}]}, "anthropic_messages", "tools[0]"),
    ("openai_responses", {"include": ["message.output_text.logprobs"]}, "openai_chat", "include"),
    ("openai_responses", {"prompt": {"id": "pmpt_1"}}, "anthropic_messages", "prompt"),
]


@pytest.mark.parametrize(("source", "change", "target", "param"), REFUSED)
def test_untranslatable_fields_are_refused_by_name(
    source: str, change: dict[str, Any], target: str, param: str
) -> None:
    body = SOURCES[source](**change)
    request = wire_format(source).parse_request(body)  # type: ignore[arg-type]
    with pytest.raises(Untranslatable) as caught:
        wire_format(target).render_request(request, "m")  # type: ignore[arg-type]
    error = caught.value
    assert (error.param, error.status, error.code) == (param, 400, "unsupported_parameter")
    assert error.target in error.message and param in error.message
    # The same request still reaches its own format.
    check_request(source, wire_format(source).render_request(request, "m"))  # type: ignore[arg-type]


REFUSED_CONTENT = [
    (
        "anthropic_messages",
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "read"},
                    {
                        "type": "document",
                        "source": {"type": "text", "media_type": "text/plain", "data": "x"},
                    },
                ],
            }
        ],
        "openai_chat",
        "messages[0].content[1]",
    ),
    (
        "anthropic_messages",
        [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": PNG,
                                },
                            }
                        ],
                    }
                ],
            },
        ],
        "openai_chat",
        "messages[1].content[0].content[0]",
    ),
    (
        "openai_chat",
        [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}}
                ],
            }
        ],
        "anthropic_messages",
        "messages[0].content[0]",
    ),
    (
        "openai_chat",
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}}
                ],
            }
        ],
        "openai_responses",
        "messages[0].content[0]",
    ),
    (
        "openai_chat",
        [
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "f", "arguments": "[1, 2]"},
                    }
                ],
            }
        ],
        "anthropic_messages",
        "messages[0].tool_calls[0]",
    ),
]


@pytest.mark.parametrize(("source", "messages", "target", "param"), REFUSED_CONTENT)
def test_untranslatable_content_names_its_path(
    source: str, messages: list[Any], target: str, param: str
) -> None:
    request = wire_format(source).parse_request(SOURCES[source](messages=messages))  # type: ignore[arg-type]
    with pytest.raises(MalformedRequest) as caught:
        wire_format(target).render_request(request, "m")  # type: ignore[arg-type]
    assert caught.value.param == param and caught.value.status == 400


def test_every_refused_field_is_in_the_docs_table() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    for _, _, _, param in REFUSED:
        assert f"`{param.split('[')[0]}" in docs, param


def test_responses_file_input_is_refused_outside_responses() -> None:
    body = responses_request(
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "x"},
                    {"type": "input_file", "file_id": "file-1"},
                ],
            }
        ]
    )
    request = wire_format("openai_responses").parse_request(body)
    with pytest.raises(Untranslatable) as caught:
        wire_format("anthropic_messages").render_request(request, "m")
    assert caught.value.param == "input[0].content[1]"


def test_neutral_values_are_not_refused() -> None:
    body = chat_request(
        n=1,
        presence_penalty=0,
        frequency_penalty=0.0,
        logprobs=False,
        modalities=["text"],
        stop=None,
    )
    translate("openai_chat", body, "anthropic_messages")
    translate("openai_chat", body, "openai_responses")


# -- bad input: MalformedRequest naming the field --------------------------------------------------

BAD = [
    ("openai_chat", lambda b: b.pop("messages"), "messages"),
    ("openai_chat", lambda b: b.update(model=""), "model"),
    ("openai_chat", lambda b: b["messages"][1].update(role="robot"), "messages[1].role"),
    (
        "openai_chat",
        lambda b: b["messages"][1]["content"][0].update(type="video"),
        "messages[1].content[0].type",
    ),
    (
        "openai_chat",
        lambda b: b["messages"][1]["content"][1]["image_url"].pop("url"),
        "messages[1].content[1].image_url.url",
    ),
    (
        "openai_chat",
        lambda b: b["messages"][2]["tool_calls"][0].pop("id"),
        "messages[2].tool_calls[0].id",
    ),
    ("openai_chat", lambda b: b["messages"][3].pop("tool_call_id"), "messages[3].tool_call_id"),
    ("openai_chat", lambda b: b.update(temperature=3), "temperature"),
    ("openai_chat", lambda b: b.update(stop=["a", 1]), "stop[1]"),
    ("openai_chat", lambda b: b["tools"][0]["function"].pop("name"), "tools[0].function.name"),
    (
        "openai_chat",
        lambda b: b["response_format"]["json_schema"].pop("name"),
        "response_format.json_schema.name",
    ),
    ("openai_chat", lambda b: b.update(reasoning_effort="extreme"), "reasoning_effort"),
    ("openai_chat", lambda b: b.update(stream="yes"), "stream"),
    ("anthropic_messages", lambda b: b.pop("max_tokens"), "max_tokens"),
    ("anthropic_messages", lambda b: b.update(temperature=1.5), "temperature"),
    ("anthropic_messages", lambda b: b["system"][0].update(type="image"), "system[0].type"),
    (
        "anthropic_messages",
        lambda b: b["messages"][0]["content"][1]["source"].update(media_type="image/bmp"),
        "messages[0].content[1].source.media_type",
    ),
    (
        "anthropic_messages",
        lambda b: b["messages"][1]["content"][2].pop("input"),
        "messages[1].content[2].input",
    ),
    (
        "anthropic_messages",
        lambda b: b["messages"][2]["content"][0].pop("tool_use_id"),
        "messages[2].content[0].tool_use_id",
    ),
    (
        "anthropic_messages",
        lambda b: b["messages"][1]["content"][0].pop("signature"),
        "messages[1].content[0].signature",
    ),
    (
        "anthropic_messages",
        lambda b: b.update(thinking={"type": "enabled"}),
        "thinking.budget_tokens",
    ),
    ("anthropic_messages", lambda b: b.update(tool_choice={"type": "tool"}), "tool_choice.name"),
    ("openai_responses", lambda b: b.pop("input"), "input"),
    ("openai_responses", lambda b: b["input"][0].update(role="robot"), "input[0].role"),
    ("openai_responses", lambda b: b["input"][2].pop("call_id"), "input[2].call_id"),
    ("openai_responses", lambda b: b["input"][3].pop("output"), "input[3].output"),
    (
        "openai_responses",
        lambda b: b["input"][0]["content"][1].pop("image_url"),
        "input[0].content[1].image_url",
    ),
    ("openai_responses", lambda b: b["text"]["format"].pop("schema"), "text.format.schema"),
    ("openai_responses", lambda b: b.update(max_output_tokens=0), "max_output_tokens"),
]


@pytest.mark.parametrize(("source", "spoil", "param"), BAD)
def test_bad_input_names_the_field(source: str, spoil: Any, param: str) -> None:
    body = SOURCES[source]()
    spoil(body)
    with pytest.raises(MalformedRequest) as caught:
        wire_format(source).parse_request(body)  # type: ignore[arg-type]
    assert caught.value.param == param
    assert param in caught.value.message and caught.value.status == 400


@pytest.mark.parametrize("source", FORMAT_NAMES)
@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]"])
def test_bodies_that_are_not_objects(source: str, body: bytes) -> None:
    with pytest.raises(MalformedRequest, match="request body"):
        wire_format(source).parse_request(body)  # type: ignore[arg-type]


STATEFUL = [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"background": True}, "background"),
    ({"store": True}, "store"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
]


@pytest.mark.parametrize(("change", "param"), STATEFUL)
def test_responses_state_is_refused_with_the_reason(change: dict[str, Any], param: str) -> None:
    with pytest.raises(MalformedRequest) as caught:
        wire_format("openai_responses").parse_request(responses_request(**change))
    assert caught.value.param == param
    assert "keeps no state" in caught.value.message and "whole conversation" in caught.value.message


def test_responses_string_input_and_store_false() -> None:
    request = wire_format("openai_responses").parse_request(
        {"model": "m", "input": "hi", "store": False}
    )
    out = wire_format("openai_chat").render_request(request, "m")
    assert out["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("target", ["openai_chat", "openai_responses"])
def test_tool_choice_without_tools_is_not_sent_to_openai(target: str) -> None:
    body = anthropic_request(tools=None, tool_choice={"type": "none"})
    body["messages"] = [{"role": "user", "content": "hi"}]
    assert "tool_choice" not in translate("anthropic_messages", body, target)
