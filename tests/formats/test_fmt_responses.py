"""Answers (not streamed): each format's real-shaped body parsed and rendered into every format,
validated with the official SDK's models; usage, including cache reads and writes, stays exact."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from fmt_requests import chat_request
from fmt_samples import (
    ANTHROPIC_MESSAGE,
    CHAT_COMPLETION,
    RESPONSES_RESPONSE,
    SAID,
    SIGNATURE,
    THOUGHT,
    USAGE,
    WEATHER_TOOL_ARGS,
    responses_object,
)
from fmt_support import check_response

from gateway.formats import FORMAT_NAMES, wire_format
from gateway.formats.errors import UpstreamProtocolError
from gateway.formats.internal import ChatResponse, Text, Thinking, ToolCall, Usage

BODIES = {
    "anthropic_messages": ANTHROPIC_MESSAGE,
    "openai_chat": CHAT_COMPLETION,
    "openai_responses": RESPONSES_RESPONSE,
}


@pytest.mark.parametrize("source", FORMAT_NAMES)
def test_parse_gives_the_whole_answer(source: str) -> None:
    response = wire_format(source).parse_response(BODIES[source])  # type: ignore[arg-type]
    kinds = [type(block).__name__ for block in response.content]
    assert kinds == ["Thinking", "Text", "ToolCall"]
    thinking, text, call = response.content
    assert isinstance(thinking, Thinking) and thinking.text == THOUGHT
    assert isinstance(text, Text) and text.text == SAID
    assert isinstance(call, ToolCall) and json.loads(call.arguments) == WEATHER_TOOL_ARGS
    assert response.stop_reason == "tool_use"
    assert response.usage == USAGE


@pytest.mark.parametrize("target", FORMAT_NAMES)
@pytest.mark.parametrize("source", FORMAT_NAMES)
def test_every_pair_renders_a_valid_answer(source: str, target: str) -> None:
    response = wire_format(source).parse_response(BODIES[source])  # type: ignore[arg-type]
    body = wire_format(target).render_response(response)  # type: ignore[arg-type]
    model = check_response(target, body)  # type: ignore[arg-type]
    again = wire_format(target).parse_response(body)  # type: ignore[arg-type]
    assert again.usage == USAGE
    assert again.stop_reason == "tool_use"
    assert [b.text for b in again.content if isinstance(b, Text)] == [SAID]
    assert [json.loads(b.arguments) for b in again.content if isinstance(b, ToolCall)] == [
        WEATHER_TOOL_ARGS
    ]
    assert [b.text for b in again.content if isinstance(b, Thinking)] == [THOUGHT]
    if target == "anthropic_messages":
        assert (model.usage.input_tokens, model.usage.cache_read_input_tokens) == (472, 100)
        assert model.usage.cache_creation_input_tokens == 50
        assert model.content[2].input == WEATHER_TOOL_ARGS
    elif target == "openai_chat":
        assert model.choices[0].finish_reason == "tool_calls"
        assert model.usage.prompt_tokens_details.cached_tokens == 100
    else:
        assert model.output_text == SAID and model.status == "completed"


def test_anthropic_signature_survives_through_anthropic_only() -> None:
    response = wire_format("anthropic_messages").parse_response(ANTHROPIC_MESSAGE)
    body = wire_format("anthropic_messages").render_response(response)
    assert body["content"][0] == {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE}
    assert body == {**ANTHROPIC_MESSAGE, "content": body["content"]}
    chat = wire_format("openai_chat").render_response(response)
    assert chat["choices"][0]["message"]["reasoning_content"] == THOUGHT
    assert SIGNATURE not in json.dumps(chat)


def test_responses_echoes_the_request() -> None:
    request = wire_format("openai_chat").parse_request(chat_request(stop=None))
    response = wire_format("anthropic_messages").parse_response(ANTHROPIC_MESSAGE)
    body = wire_format("openai_responses").render_response(response, request)
    model = check_response("openai_responses", body)
    assert model.instructions == "You are a weather assistant."
    assert model.tools[0].name == "get_weather" and model.parallel_tool_calls is True
    assert model.max_output_tokens == 500 and model.temperature == 0.7
    assert model.text.format.type == "json_schema"
    assert model.output[2].call_id == "toolu_01T1x1fJ34qAmk2tNTrN7Up6"


STOPS = [
    # (source, change to the source body, what each target says)
    (
        "openai_chat",
        {"finish_reason": "length"},
        {
            "anthropic_messages": "max_tokens",
            "openai_responses": ("incomplete", "max_output_tokens"),
        },
    ),
    (
        "openai_chat",
        {"finish_reason": "content_filter"},
        {"anthropic_messages": "refusal", "openai_responses": ("incomplete", "content_filter")},
    ),
    (
        "anthropic_messages",
        {"stop_reason": "stop_sequence", "stop_sequence": "END"},
        {"openai_chat": "stop", "openai_responses": ("completed", None)},
    ),
    (
        "anthropic_messages",
        {"stop_reason": "model_context_window_exceeded"},
        {"openai_chat": "length", "openai_responses": ("incomplete", "max_output_tokens")},
    ),
    (
        "anthropic_messages",
        {"stop_reason": "refusal"},
        {"openai_chat": "content_filter", "openai_responses": ("incomplete", "content_filter")},
    ),
]


def _with(source: str, change: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(BODIES[source])
    if source == "openai_chat":
        body["choices"][0].update(change)
        body["choices"][0]["message"]["tool_calls"] = None
    else:
        body.update(change)
        body["content"] = [block for block in body["content"] if block["type"] != "tool_use"]
    return body


@pytest.mark.parametrize(("source", "change", "expected"), STOPS)
def test_stop_reasons_map_across_formats(
    source: str, change: dict[str, Any], expected: dict[str, Any]
) -> None:
    response = wire_format(source).parse_response(_with(source, change))  # type: ignore[arg-type]
    for target, said in expected.items():
        body = wire_format(target).render_response(response)  # type: ignore[arg-type]
        check_response(target, body)  # type: ignore[arg-type]
        if target == "anthropic_messages":
            assert body["stop_reason"] == said
        elif target == "openai_chat":
            assert body["choices"][0]["finish_reason"] == said
        else:
            status, reason = said
            assert body["status"] == status
            assert (body["incomplete_details"] or {}).get("reason") == reason


def test_stop_sequence_survives_anthropic_to_anthropic() -> None:
    response = wire_format("anthropic_messages").parse_response(
        _with("anthropic_messages", {"stop_reason": "stop_sequence", "stop_sequence": "END"})
    )
    body = wire_format("anthropic_messages").render_response(response)
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "END")


def test_responses_incomplete_parses_as_max_tokens() -> None:
    body = responses_object(
        "incomplete", [RESPONSES_RESPONSE["output"][1]], RESPONSES_RESPONSE["usage"]
    )
    body["incomplete_details"] = {"reason": "max_output_tokens"}
    assert wire_format("openai_responses").parse_response(body).stop_reason == "max_tokens"


def test_refusals_render_in_each_format() -> None:
    body = copy.deepcopy(CHAT_COMPLETION)
    body["choices"][0]["message"] = {
        "role": "assistant",
        "content": None,
        "refusal": "I can't help with that.",
    }
    body["choices"][0]["finish_reason"] = "stop"
    response = wire_format("openai_chat").parse_response(body)
    anthropic = wire_format("anthropic_messages").render_response(response)
    assert anthropic["content"] == [{"type": "text", "text": "I can't help with that."}]
    responses = check_response(
        "openai_responses", wire_format("openai_responses").render_response(response)
    )
    assert responses.output[0].content[0].type == "refusal"
    chat = wire_format("openai_chat").render_response(
        wire_format("openai_responses").parse_response(responses.model_dump())
    )
    assert chat["choices"][0]["message"]["refusal"] == "I can't help with that."


UPSTREAM_FAULTS = [
    (
        "openai_chat",
        lambda b: b["choices"].append(copy.deepcopy(b["choices"][0])),
        "several choices",
    ),
    ("openai_chat", lambda b: b.update(choices=[]), "no choices"),
    (
        "openai_chat",
        lambda b: b["usage"]["prompt_tokens_details"].update(cached_tokens=700),
        "more cached tokens",
    ),
    ("openai_chat", lambda b: b["usage"].update(prompt_tokens=-1), "not a token count"),
    ("anthropic_messages", lambda b: b.pop("content"), "no content"),
    (
        "openai_responses",
        lambda b: b.update(status="failed", error={"code": "server_error", "message": "boom"}),
        "failed: boom",
    ),
]


@pytest.mark.parametrize(("source", "spoil", "match"), UPSTREAM_FAULTS)
def test_broken_upstream_answers_are_protocol_errors(source: str, spoil: Any, match: str) -> None:
    body = copy.deepcopy(BODIES[source])
    spoil(body)
    with pytest.raises(UpstreamProtocolError, match=match) as caught:
        wire_format(source).parse_response(body)  # type: ignore[arg-type]
    assert caught.value.status == 502


def test_tool_arguments_that_are_not_an_object_cannot_reach_an_anthropic_client() -> None:
    response = ChatResponse("id", "m", [ToolCall("call_1", "f", "not json")], "tool_use")
    with pytest.raises(UpstreamProtocolError, match="not a JSON object"):
        wire_format("anthropic_messages").render_response(response)
    # OpenAI formats carry the text as the model wrote it.
    chat = wire_format("openai_chat").render_response(response)
    assert chat["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == "not json"


def test_raw_output_reaches_only_its_own_format() -> None:
    body = copy.deepcopy(ANTHROPIC_MESSAGE)
    body["content"].append(
        {
            "type": "server_tool_use",
            "id": "srvtoolu_1",
            "name": "web_search",
            "input": {"query": "x"},
        }
    )
    response = wire_format("anthropic_messages").parse_response(body)
    assert (
        wire_format("anthropic_messages").render_response(response)["content"][-1]
        == body["content"][-1]
    )
    with pytest.raises(UpstreamProtocolError, match="server_tool_use"):
        wire_format("openai_chat").render_response(response)


def test_usage_without_cache_fields() -> None:
    body = copy.deepcopy(CHAT_COMPLETION)
    body["usage"] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    response = wire_format("openai_chat").parse_response(body)
    assert response.usage == Usage(prompt_tokens=10, completion_tokens=5)
    anthropic = wire_format("anthropic_messages").render_response(response)
    assert anthropic["usage"] == {
        "input_tokens": 10,
        "output_tokens": 5,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
