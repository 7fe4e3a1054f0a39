"""``/v1/responses`` with the openai SDK's ``responses`` API (JSON and streaming, input items,
function tools and their outputs), stateless, through a real gateway: untouched (``store:
false``) to an upstream that serves the Responses API, translated to Chat Completions, Azure,
Anthropic and engine-fleet upstreams."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from native_gateway import NativeGateway

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
MODELS = ("gpt", "gpt-chat", "azure-gpt", "claude", "fleet-llama")
NAMES = {
    "gpt": "openai",
    "gpt-chat": "openai",
    "azure-gpt": "azure",
    "claude": "anthropic",
    "fleet-llama": "engine",
}


def client(native: NativeGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=native.gateway.v1, api_key=native.key, max_retries=0)


@pytest.mark.parametrize("model", MODELS)
def test_function_call_and_its_output_round_trip(native: NativeGateway, model: str) -> None:
    sdk = client(native)
    question = {"role": "user", "content": "Weather in Paris?"}
    first = sdk.responses.create(
        model=model, instructions="Use tools.", input=[question], tools=TOOLS
    )
    assert first.status == "completed"
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert calls[0].arguments == '{"city":"Paris"}'
    follow_up = [
        question,
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
         "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C"},
    ]  # fmt: skip
    second = sdk.responses.create(model=model, input=follow_up, tools=TOOLS)
    assert second.output_text == f"{NAMES[model]} read the tool result: 18 C"
    events = list(sdk.responses.create(model=model, input=[question], tools=TOOLS, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-1] == "response.completed"
    done = events[-1].response.output
    assert done[-1].type == "function_call" and done[-1].arguments == '{"city":"Paris"}'
    numbers = [event.sequence_number for event in events]
    assert numbers == sorted(numbers)


def test_text_stream_deltas_add_up(native: NativeGateway) -> None:
    for model in MODELS:
        events = list(client(native).responses.create(model=model, input="hi you", stream=True))
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text == f"{NAMES[model]} says: hi you"
        assert events[-1].response.output_text == text
        usage = events[-1].response.usage
        assert usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0


def test_native_upstream_gets_the_body_untouched_with_store_false(native: NativeGateway) -> None:
    body = {"model": "gpt", "input": "hi", "truncation": "auto", "text": {"verbosity": "low"}}
    client(native).responses.create(**body)  # type: ignore[arg-type]
    seen = native.fleet["openai"].seen[-1]
    assert seen.path == "/v1/responses"
    assert seen.body == {**body, "model": "gpt-4o", "store": False}
    # The chat-only provider of the same upstream gets Chat Completions instead.
    client(native).responses.create(model="gpt-chat", input="hi")
    seen = native.fleet["openai"].seen[-1]
    assert seen.path == "/v1/chat/completions"
    assert seen.body["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("previous_response_id", "resp_123"),
        ("store", True),
        ("conversation", "conv_1"),
        ("background", True),
    ],
)
def test_state_is_refused_with_a_clear_400(native: NativeGateway, field: str, value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(native).responses.create(model="gpt", input="hi", **{field: value})
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == field
    assert (
        "keeps no state" in error["message"] and "whole conversation in input" in (error["message"])
    )
    assert caught.value.status_code == 400


def test_errors_are_openai_envelopes(native: NativeGateway) -> None:
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=native.gateway.v1, api_key="sk-sy-nope", max_retries=0
        ).responses.create(model="gpt", input="hi")
    with pytest.raises(openai.BadRequestError) as caught:
        client(native).responses.create(model="gpt", input=[{"role": "user", "content": 5}])  # type: ignore[list-item]
    assert caught.value.body["param"].startswith("input[0].content")  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client(native).responses.create(model="missing", input="hi")
